"""Start-up failures of the broker, in the test's own process: what was opened before the failure is closed."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from broker.__main__ import StartError, serve
from broker.settings import BrokerSettings
from broker.sqlite_store import SqliteStore


async def _store_is_free(data: Path) -> None:
    store = SqliteStore(data)  # StoreUnavailable while another store of this process still holds the lock
    await store.close()


@pytest.mark.parametrize("flag", ["listen", "metrics_listen"])
def test_a_start_failure_after_the_store_opened_closes_the_store(tmp_path: Path, flag: str) -> None:
    """Past store.start, a port already in use (--listen, --metrics-listen) fails the start with one line; the
    store is closed on the way out, so its data directory is free for the next broker (it was left locked)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        ports = {"listen": "127.0.0.1:0", "metrics_listen": ""} | {flag: busy}
        settings = BrokerSettings(name="b1", data_dir=tmp_path / "b1", topics=("orders",), **ports)

        async def main() -> None:
            with pytest.raises(StartError, match=f"--{flag.replace('_', '-')} {busy}: cannot"):
                await serve(settings)
            await _store_is_free(tmp_path / "b1")

        asyncio.run(main())
