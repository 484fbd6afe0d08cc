"""The SQLite store's message batches: what goes in one commit comes back, per offset, after a reopen."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from broker.errors import StoreUnavailable
from broker.sqlite_store import BATCH_MESSAGES, SqliteStore
from broker.store import NewMessage, PutInflight, Record

N = BATCH_MESSAGES * 2 + 7  # more than one batch row per queue in one commit


def message(i: int, queue_id: int = 0) -> NewMessage:
    tag = None if i % 3 == 0 else f'tag "{i % 5}" ✓'
    return NewMessage("t", queue_id, 1_000 + i, tag, b"p%d" % i * (1 + i % 7))


async def write(store: SqliteStore) -> list[Record]:
    store.start(asyncio.get_running_loop())
    first = await store.submit([message(i) for i in range(N)], [])
    # Two commits queued together share one group commit; queue 1 interleaves.
    second, third = await asyncio.gather(
        store.submit([message(i) for i in range(N, N + 40)], [PutInflight("g", "t", 0, 3, 1, 2**47, 9)]),
        store.submit([message(i, queue_id=1) for i in range(5)], []),
    )
    return first + second + third


def test_messages_come_back_by_offset_range_and_after_reopen(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SqliteStore(tmp_path)
        records = await write(store)
        assert [r.offset for r in records[: N + 40]] == list(range(N + 40))
        assert [r.offset for r in records[N + 40 :]] == list(range(5))
        expected = {i: message(i).payload for i in range(N + 40)}

        # A contiguous span crossing batch boundaries, and a few offsets far apart.
        span = list(range(BATCH_MESSAGES - 3, BATCH_MESSAGES * 2 + 2))
        assert await store.read_payloads("t", 0, span) == {o: expected[o] for o in span}
        sparse = [0, BATCH_MESSAGES, N + 39]
        assert await store.read_payloads("t", 0, sparse) == {o: expected[o] for o in sparse}
        assert await store.read_payloads("t", 0, [N + 40]) == {}
        assert await store.read_payloads("t", 1, [4]) == {4: message(4, 1).payload}

        listed = await store.read_range("t", 0, BATCH_MESSAGES - 1, 600)
        assert [(r.offset, r.store_ms, r.tag, r.payload) for r in listed] == [
            (o, 1_000 + o, message(o).tag, expected[o]) for o in range(BATCH_MESSAGES - 1, N + 40)
        ]
        assert [r.offset for r in await store.read_range("t", 0, 10, 3)] == [10, 11, 12]
        assert await store.read_range("t", 0, N + 40, 10) == []
        await store.close()

        reopened = SqliteStore(tmp_path)
        snap = reopened.load()
        index = snap.queues[("t", 0)]
        assert index.min_offset == 0
        assert index.store_ms == [1_000 + i for i in range(N + 40)]
        assert index.tags == [message(i).tag for i in range(N + 40)]
        assert len(snap.queues[("t", 1)].tags) == 5
        assert snap.inflight == [PutInflight("g", "t", 0, 3, 1, 2**47, 9)]
        reopened.start(asyncio.get_running_loop())
        more = await reopened.submit([message(0)], [])
        assert more[0].offset == N + 40  # offsets carry on after the reopen
        await reopened.close()

    asyncio.run(scenario())


def test_a_data_directory_of_another_layout_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "broker.sqlite3") as conn:
        conn.execute("CREATE TABLE messages (topic TEXT)")
    with pytest.raises(StoreUnavailable, match="layout 1, this broker reads layout 2"):
        SqliteStore(tmp_path)
