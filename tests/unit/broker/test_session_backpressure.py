"""The broker's Session stream against a caller that asks faster than it reads: the broker stops reading
requests once the answers not yet taken pass a byte bound, instead of buffering answers without limit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker import server
from broker.core import BrokerCore
from broker.metrics import BrokerMetrics
from broker.settings import BrokerSettings
from broker.sqlite_store import SqliteStore


class NeverReads:
    """A Session context whose writes never complete: the caller takes no answer."""

    async def write(self, response: pb.SessionResponse) -> None:
        await asyncio.Event().wait()


def test_a_caller_that_does_not_read_stops_being_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "SESSION_MAX_OUTBOX_BYTES", 64 * 1024, raising=False)
    monkeypatch.setattr(server, "WRITER_DRAIN_S", 0.1)  # the end of the stream does not wait for this reader
    asked = 0

    async def requests() -> AsyncIterator[pb.SessionRequest]:
        nonlocal asked
        for i in range(200):
            await asyncio.sleep(0.001)  # a read from the network takes a moment; answers go out meanwhile
            asked += 1
            pop = pb.PopRequest(topic="t", group="g", filter="*", max_messages=1, invisible_ms=60_000, poll_ms=0)
            yield pb.SessionRequest(id=i + 1, pop=pop)
        await asyncio.Event().wait()  # the stream stays open

    async def scenario() -> None:
        store = SqliteStore(tmp_path)
        core = BrokerCore(BrokerSettings(name="b1", data_dir=tmp_path), store)
        store.set_listener(core)
        store.start(asyncio.get_running_loop())
        core.restore(store.load())
        await core.send([pb.Message(topic="t", body=b"x" * 16_000) for _ in range(200)])
        servicer = server.BrokerServicer(core, BrokerMetrics())
        session = asyncio.create_task(servicer.Session(requests(), NeverReads()))  # type: ignore[arg-type]
        await asyncio.sleep(1.0)
        # 16 KB answers: past 64 KB not taken, reading stops (a few more may be in flight).
        assert asked < 20
        session.cancel()
        await asyncio.gather(session, return_exceptions=True)
        await core.close()
        await store.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
