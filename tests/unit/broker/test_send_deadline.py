"""A Send's deadline (SendRequest.timeout_ms): a Send whose commit has not started when its caller's time is up
stores nothing and is refused TooManyRequests, so a caller that gave up (a proxy's timeout) may retry it without
making a duplicate; one whose commit starts in time is stored as any."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker import handlers
from broker.store import Snapshot
from popgate_contract import errors
from tests.unit.broker.cores import ManualClock, broker, loaded

NOW = 1_764_000_000_000

LATE = {  # each kind of thing a Send stores: a message, a run's, a scheduled one, a transaction's half messages
    "message": pb.SendRequest(messages=[pb.Message(topic="t", body=b"late", message_id="late")]),
    "run": pb.SendRequest(
        runs=[pb.SharedRun(shared=pb.Message(topic="t"), bodies=[b"a", b"b"], message_ids=["a", ""])]
    ),
    "scheduled": pb.SendRequest(messages=[pb.Message(topic="t", body=b"s", deliver_at_ms=NOW + 60_000)]),
    "half": pb.SendRequest(messages=[pb.Message(topic="t", body=b"h", transactional=True)]),
    "half run": pb.SendRequest(
        runs=[pb.SharedRun(shared=pb.Message(topic="t", transactional=True), bodies=[b"h"], message_ids=["h"])]
    ),
    "new topic": pb.SendRequest(messages=[pb.Message(topic="new", body=b"n")]),
}


def stored_messages(snap: Snapshot, topic: str) -> int:
    return sum(len(index.store_ms) for (name, _), index in snap.queues.items() if name == topic)


@pytest.mark.parametrize("flush", ["sync", "async"])  # async: a Send of scheduled or half messages only is no
@pytest.mark.parametrize("kind", list(LATE))  # consumer state the store may defer: its deadline holds too
async def test_a_send_queued_past_its_deadline_is_refused_and_not_stored(tmp_path: Path, kind: str, flush: str) -> None:
    late = pb.SendRequest()
    late.CopyFrom(LATE[kind])
    late.timeout_ms = 50
    async with broker(tmp_path, flush=flush, clock=ManualClock(NOW)) as (core, store):
        store._writing.acquire()  # a slow disk: no commit starts meanwhile
        try:
            first = asyncio.ensure_future(
                handlers.send(core, pb.SendRequest(messages=[pb.Message(topic="t", body=b"1")]), pb.SendResponse())
            )
            refused = asyncio.ensure_future(handlers.send(core, late, pb.SendResponse()))
            await asyncio.sleep(0.2)
        finally:
            store._writing.release()
        await first  # no deadline: stored however long it waited
        with pytest.raises(errors.TooManyRequests, match="not stored"):
            await refused
        assert core.sends.in_flight.used == 0
        assert not core.schedule and not core.transactions.schedule
        late.timeout_ms = 5_000  # in time: stored
        answer = pb.SendResponse()
        await handlers.send(core, late, answer)
        assert len(answer.results) == len(late.messages) + sum(len(r.bodies) for r in late.runs)
    snap = await loaded(tmp_path)
    appended = kind in ("message", "run")
    assert stored_messages(snap, "t") == 1 + appended * len(answer.results)
    assert len(snap.scheduled) == (kind == "scheduled") and len(snap.halves) == kind.startswith("half")
    assert ("new", 0) in snap.queues or kind != "new topic"
