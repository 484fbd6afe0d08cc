"""Start-up failures of the broker, in the test's own process: what was opened before the failure is closed."""

from __future__ import annotations

import asyncio
import socket
import sqlite3
from pathlib import Path

import pytest

from broker.__main__ import StartError, serve
from broker.settings import BrokerSettings
from broker.sqlite_store import SqliteStore
from broker.store import NewMessage
from popgate_contract.errors import StoreUnavailable


async def _store_is_free(data: Path) -> None:
    store = SqliteStore(data)  # StoreUnavailable while another store of this process still holds the lock
    await store.close()


@pytest.mark.parametrize("flag", ["listen", "metrics_listen"])
async def test_a_start_failure_after_the_store_opened_closes_the_store(tmp_path: Path, flag: str) -> None:
    """Past store.start, a port already in use (--listen, --metrics-listen) fails the start with one line; the
    store is closed on the way out, so its data directory is free for the next broker (it was left locked)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        ports = {"listen": "127.0.0.1:0", "metrics_listen": ""} | {flag: busy}
        settings = BrokerSettings(name="b1", data_dir=tmp_path / "b1", topics=("orders",), **ports)
        with pytest.raises(StartError, match=f"--{flag.replace('_', '-')} {busy}: cannot"):
            await serve(settings)
        await _store_is_free(tmp_path / "b1")


async def _start_fails(settings: BrokerSettings, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        await serve(settings)


async def test_a_data_file_that_is_not_a_database_fails_the_start_with_one_line(tmp_path: Path) -> None:
    data = tmp_path / "b1"
    data.mkdir()
    (data / "broker.sqlite3").write_bytes(b"not a database " * 512)
    settings = BrokerSettings(name="b1", data_dir=data, listen="127.0.0.1:0")
    await _start_fails(settings, StartError, f"--data-dir {data}: the store cannot be opened")


async def test_a_damaged_index_row_fails_the_start_naming_it(tmp_path: Path) -> None:
    data = tmp_path / "b1"
    settings = BrokerSettings(name="b1", data_dir=data, listen="127.0.0.1:0", topics=("orders",))
    store = SqliteStore(data)
    store.load()
    store.start(asyncio.get_running_loop())
    await store.submit([NewMessage("orders", 0, 1, None, b"payload")], [])
    await store.close()
    with sqlite3.connect(data / "broker.sqlite3") as db:
        db.execute("UPDATE batches SET meta = 'not json'")
    await _start_fails(settings, StoreUnavailable, "the index of orders queue 0 from offset 0 is damaged")
