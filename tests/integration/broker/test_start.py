"""Start-up failures of the broker, in the test's own process: what was opened before the failure is closed."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

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
    """A port already in use (--listen past store.start, --metrics-listen before the store is read) fails the start
    with one line; the store is closed on the way out, so its data directory is free for the next broker."""
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
    with closing(sqlite3.connect(data / "broker.sqlite3")) as db, db:
        db.execute("UPDATE batches SET meta = 'not json'")
    await _start_fails(settings, StoreUnavailable, "the index of orders queue 0 from offset 0 is damaged")


def _get(address: str, path: str) -> tuple[int, bytes]:
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def _serves(address: str, family: bytes, within_s: float = 30.0) -> bool:
    """Whether /metrics at `address` shows `family` within `within_s` (polled: the broker runs in this process)."""
    deadline = time.monotonic() + within_s
    while family not in _get(address, "/metrics")[1]:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _with_metrics(tmp_path: Path) -> tuple[BrokerSettings, str]:
    """A broker's settings serving /metrics on a free port, and that port's address."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{taken.getsockname()[1]}"
    settings = BrokerSettings(
        name="b1", data_dir=tmp_path / "b1", listen="127.0.0.1:0", metrics_listen=address, topics=("orders",)
    )
    return settings, address


async def test_metrics_are_served_while_the_store_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker reading a large store takes minutes before it serves: meanwhile its /metrics answers (the process's
    own families, none of the store's yet), so a scrape finds it up and starting — PopgateTargetDown does not fire
    for a broker that is only starting. The store's families follow once it is read."""
    reading = threading.Event()
    reads_on = threading.Event()
    real_load = SqliteStore.load

    def slow_load(store: SqliteStore) -> object:
        reading.set()
        reads_on.wait(30)
        return real_load(store)

    monkeypatch.setattr(SqliteStore, "load", slow_load)
    settings, address = _with_metrics(tmp_path)
    loop = asyncio.get_running_loop()
    broker = asyncio.create_task(serve(settings))
    try:
        assert await loop.run_in_executor(None, reading.wait, 30)
        status, body = await loop.run_in_executor(None, _get, address, "/metrics")
        assert status == 200 and b"popgate_build_info" in body and b"popgate_broker_max_offset" not in body
    finally:
        reads_on.set()  # the read goes on (a store is never closed under its own read)
    assert await loop.run_in_executor(None, _serves, address, b"popgate_broker_max_offset")
    broker.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await broker
    with pytest.raises(ConnectionRefusedError):
        await loop.run_in_executor(None, _get, address, "/metrics")
    await _store_is_free(tmp_path / "b1")


async def test_livez_and_metrics_answer_while_the_store_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening the store (a layout-1 migration: minutes on a large one) runs off the event loop: meanwhile /livez,
    the pod's startup and liveness probe, and /metrics answer, so kubelet does not kill a migrating broker (which
    would roll the migration back and start it over on every restart)."""
    opening = threading.Event()
    opens_on = threading.Event()
    real_open = SqliteStore._open

    def slow_open(store: SqliteStore, *args: Any) -> None:
        opening.set()
        opens_on.wait(30)
        real_open(store, *args)

    def probe() -> list[tuple[int, bytes] | OSError]:  # in a thread of its own: the loop may be the one held
        opening.wait(30)
        try:
            return [_answer(address, path) for path in ("/livez", "/metrics")]
        finally:
            opens_on.set()

    monkeypatch.setattr(SqliteStore, "_open", slow_open)
    settings, address = _with_metrics(tmp_path)
    loop = asyncio.get_running_loop()
    probed = loop.run_in_executor(None, probe)
    broker = asyncio.create_task(serve(settings))
    try:
        livez, scrape = await probed
        assert livez == (200, b"ok\n")
        assert not isinstance(scrape, OSError) and scrape[0] == 200 and b"popgate_build_info" in scrape[1]
        assert await loop.run_in_executor(None, _serves, address, b"popgate_broker_max_offset")
    finally:
        opens_on.set()
        broker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await broker
    await _store_is_free(tmp_path / "b1")


def _answer(address: str, path: str) -> tuple[int, bytes] | OSError:
    try:
        return _get(address, path)
    except OSError as exc:  # no answer within its timeout: the loop is held
        return exc
