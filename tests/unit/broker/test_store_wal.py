"""The WAL's restart never stalls the store's commits: a reader holding a snapshot (an online backup, an `sqlite3`
query) delays the restart, not the writes (docs/BROKER.md "Store")."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from broker.sqlite_store import SqliteStore
from broker.store import NewMessage

BODY = os.urandom(64 * 1024)


@asynccontextmanager
async def small_wal_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[SqliteStore]:
    """A started store whose WAL starts over past 1 MiB; closed on the way out."""
    monkeypatch.setattr("broker.store_wal.WAL_RESTART_BYTES", 1 << 20)
    store = SqliteStore(tmp_path)
    store.start(asyncio.get_running_loop())
    try:
        yield store
    finally:
        await store.close()


async def commit(store: SqliteStore) -> None:
    await store.submit([NewMessage("t", 0, 1_000, None, BODY) for _ in range(4)], [])  # 256 KiB


async def test_commits_go_on_while_a_reader_holds_a_snapshot_and_the_wal_restarts_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = tmp_path / "broker.sqlite3-wal"
    async with small_wal_store(tmp_path, monkeypatch) as store:
        await commit(store)
        reader = sqlite3.connect(tmp_path / "broker.sqlite3", isolation_level=None)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM batches").fetchone()  # a snapshot held, as a backup holds one
        started = time.monotonic()
        for _ in range(8):  # 2 MiB: the WAL passes its restart size while the reader holds its snapshot
            await commit(store)
        elapsed = time.monotonic() - started
        assert wal.stat().st_size > 1 << 20  # it cannot start over under the reader
        reader.execute("COMMIT")
        reader.close()
        assert elapsed < 2.5, f"8 commits took {elapsed:.1f} s while a reader held a snapshot"
        deadline = time.monotonic() + 10
        while wal.stat().st_size > 1 << 20:  # started over (and cut back) once the reader let go
            assert time.monotonic() < deadline, "the WAL was not started over after the reader let go"
            await asyncio.sleep(0.05)
            await commit(store)


async def test_the_wal_stays_bounded_while_short_reads_go_on_without_a_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = tmp_path / "broker.sqlite3-wal"
    small = os.urandom(2048)
    async with small_wal_store(tmp_path, monkeypatch) as store:
        for _ in range(30):
            await store.submit([NewMessage("t", 0, 1_000, None, small) for _ in range(2)], [])
        reading = True

        async def reader() -> None:  # a Pop's payload reads, back to back: none holds a snapshot for long
            while reading:
                await store.read_payloads("t", {0: list(range(60))})

        readers = [asyncio.ensure_future(reader()) for _ in range(4)]
        largest = 0
        for _ in range(256):  # 64 MiB written while the readers read: a WAL never started over holds it all
            await store.submit([NewMessage("t", 1, 1_000, None, BODY) for _ in range(4)], [])
            largest = max(largest, wal.stat().st_size)
            await asyncio.sleep(0.01)  # a steady stream of sends, leaving the readers their share of the CPU
        reading = False
        await asyncio.gather(*readers)
        # A quarter of the 64 MiB a WAL never started over holds: a loaded host postpones some of its restarts.
        assert largest < 16 << 20, f"the WAL reached {largest / 2**20:.1f} MiB at a 1 MiB restart size"
