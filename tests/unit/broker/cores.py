"""A BrokerCore over a real SqliteStore in the test's own loop, for unit tests without sockets, and a clock
tests set."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from broker.clock import Clock, WallClock
from broker.core import BrokerCore
from broker.settings import BrokerSettings
from broker.sqlite_store import SqliteStore
from broker.store import Snapshot


class ManualClock:
    """A `broker.clock.Clock` that stands still until the test moves it: moving `now` (milliseconds) is time
    passing, on both its wall and its monotonic clock; `step` moves the wall clock alone (an NTP step)."""

    def __init__(self, now: int) -> None:
        self.now = now
        self.stepped = 0

    def now_ms(self) -> int:
        return self.now

    def monotonic_ms(self) -> int:
        return self.now - self.stepped

    def step(self, ms: int) -> None:
        self.now += ms
        self.stepped += ms


@asynccontextmanager
async def broker(
    data: Path, *, clock: Clock | None = None, state_delay_s: float | None = None, **settings: Any
) -> AsyncIterator[tuple[BrokerCore, SqliteStore]]:
    """A broker core on `data`, started and restored as broker/__main__.py does, but with no sweep task:
    only arrivals and timers wake held requests. Its clock is `clock` (default: the wall clock). Topics are
    auto-created unless the test says ``auto_create=False`` (the tests predate the broker's default turning
    off). `state_delay_s`: the store's (default: its own). Closed (core, then store) on the way out."""
    settings.setdefault("auto_create", True)
    delay: dict[str, Any] = {} if state_delay_s is None else {"state_delay_s": state_delay_s}
    store = SqliteStore(data, flush=settings.get("flush", "async"), **delay)
    core = BrokerCore(BrokerSettings(name="b1", data_dir=data, **settings), store, clock=clock or WallClock())
    store.set_listener(core)
    store.start(asyncio.get_running_loop())
    core.restore(store.load())
    core.start()
    try:
        yield core, store
    finally:
        await core.close()
        await store.close()


def submitted_event(core: BrokerCore) -> asyncio.Event:
    """An event set once the core's send path has submitted a commit to the store (that commit under way): a test
    cancels a caller there."""
    event = asyncio.Event()
    real = core.sends.submit

    def submit(*args: Any, **kwargs: Any) -> Any:
        committed = real(*args, **kwargs)
        event.set()
        return committed

    core.sends.submit = submit  # type: ignore[method-assign]
    return event


async def loaded(data: Path) -> Snapshot:
    """What a broker starting on `data` loads, its store closed again (its connection and the directory's lock)."""
    store = SqliteStore(data)
    try:
        return store.load()
    finally:
        await store.close()
