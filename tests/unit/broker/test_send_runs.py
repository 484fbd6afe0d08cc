"""A Send's runs (SendRequest.runs, a proxy's SendShared): messages alike but for their bodies and ids, stored as
the same messages sent one by one would be, answered in order after the Send's plain messages, refused whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker import handlers
from broker.core import BrokerCore
from popgate_contract import errors
from popgate_contract.v2wire import static_system
from tests.unit.broker.cores import ManualClock, broker

NOW = 1_764_000_000_000


def alike(topic: str, **fields: object) -> pb.Message:
    return pb.Message(topic=topic, tag="paid", keys=["k1", "k2"], properties={"a": "1"}, born_host="10.0.0.1", **fields)  # type: ignore[arg-type]


async def stored(core: BrokerCore, topic: str) -> list[pb.Message]:
    """Every message of `topic`, as a v2 Pop (the proxy's) answers it, in body order."""
    out = pb.PopResponse()
    pop = pb.PopRequest(topic=topic, group="g", max_messages=32, invisible_ms=60_000, v2=True)
    await handlers.pop(core, pop, out)
    return sorted((m.stored.message for m in out.messages), key=lambda m: m.body)


@pytest.mark.parametrize("fields", [{}, {"born_ms": NOW - 5}, {"message_group": "g1"}, {"priority": 3}])
async def test_a_runs_messages_are_stored_as_the_same_messages_sent_one_by_one(
    tmp_path: Path, fields: dict[str, object]
) -> None:
    bodies, ids = [b"b0", b"b1", b"b2"], ["id-0", "", "id-2"]  # an empty id: the broker makes one
    async with broker(tmp_path, clock=ManualClock(NOW)) as (core, _):
        one_by_one = []
        for body, message_id in zip(bodies, ids, strict=True):
            m = alike("plain", **fields)
            m.body, m.message_id = body, message_id
            one_by_one.append(m)
        first = pb.SendResponse()
        await handlers.send(core, pb.SendRequest(messages=one_by_one), first)
        run = pb.SharedRun(shared=alike("runs", **fields), bodies=bodies, message_ids=ids)
        second = pb.SendResponse()
        await handlers.send(core, pb.SendRequest(runs=[run]), second)
        plain, runs = await stored(core, "plain"), await stored(core, "runs")
    assert [r.message_id for r in second.results][::2] == ["id-0", "id-2"] and second.results[1].message_id
    for a, b, made in zip(plain, runs, second.results, strict=True):
        assert b.message_id == made.message_id and b.v2_system == static_system(b)
        b.topic, b.message_id, b.v2_system = a.topic, a.message_id, b""
        a.v2_system = b""
        assert a == b
    if "message_group" in fields:
        assert len({r.queue_id for r in second.results}) == 1  # one queue, in order


async def test_a_sends_results_are_its_messages_then_each_runs_in_order(tmp_path: Path) -> None:
    request = pb.SendRequest(
        messages=[pb.Message(topic="t", body=b"m", message_id="plain")],
        runs=[
            pb.SharedRun(shared=pb.Message(topic="t"), bodies=[b"a", b"b"], message_ids=["a", "b"]),
            pb.SharedRun(shared=pb.Message(topic="u", deliver_at_ms=NOW + 60_000), bodies=[b"c"], message_ids=["c"]),
            pb.SharedRun(shared=pb.Message(topic="t"), bodies=[b"d"], message_ids=["d"]),
            pb.SharedRun(shared=pb.Message(topic="t", transactional=True), bodies=[b"e"], message_ids=["e"]),
        ],
    )
    async with broker(tmp_path, clock=ManualClock(NOW)) as (core, _):
        out = pb.SendResponse()
        await handlers.send(core, request, out)
    assert [r.message_id for r in out.results] == ["plain", "a", "b", "c", "d", "e"]
    # "c" waits in the schedule, "e" for its transaction's end
    assert [r.offset >= 0 for r in out.results] == [True, True, True, False, True, False]
    assert [bool(r.recall_handle) for r in out.results] == [False, False, False, True, False, False]
    assert [bool(r.transaction_id) for r in out.results] == [False] * 5 + [True]


@pytest.mark.parametrize(
    ("run", "error"),
    [
        (pb.SharedRun(shared=pb.Message(topic="t"), bodies=[b"a", b"b"], message_ids=["a"]), errors.BadRequest),
        (pb.SharedRun(shared=pb.Message(topic="t", body=b"x"), bodies=[b"a"], message_ids=["a"]), errors.BadRequest),
        (
            pb.SharedRun(shared=pb.Message(topic="t"), bodies=[b"a", b""], message_ids=["a", "b"]),
            errors.MessageBodyEmpty,
        ),
        (pb.SharedRun(shared=pb.Message(topic="t"), bodies=[b"a"], message_ids=["\x00"]), errors.IllegalMessage),
        (
            pb.SharedRun(shared=pb.Message(topic="t", tag=""), bodies=[b"a"], message_ids=["a"]),
            errors.IllegalMessage,
        ),
    ],
)
async def test_a_send_with_a_bad_run_is_refused_whole(tmp_path: Path, run: pb.SharedRun, error: type) -> None:
    fine = pb.SharedRun(shared=pb.Message(topic="t"), bodies=[b"ok"], message_ids=["ok"])
    async with broker(tmp_path) as (core, _):
        with pytest.raises(error):
            await handlers.send(
                core, pb.SendRequest(messages=[pb.Message(topic="t", body=b"m")], runs=[fine, run]), pb.SendResponse()
            )
        assert await stored(core, "t") == []


async def refusal(data: Path, request: pb.SendRequest) -> type:
    """The error a fresh broker refuses `request` with (nothing of it stored)."""
    async with broker(data, clock=ManualClock(NOW)) as (core, _):
        with pytest.raises(errors.DomainError) as refused:
            await handlers.send(core, request, pb.SendResponse())
        assert await stored(core, "t") == []
    return type(refused.value)


@pytest.mark.parametrize(
    ("shared", "bodies", "ids"),
    [
        (pb.Message(topic="bad topic"), [b"a", b"b"], ["\x02", "b"]),
        (pb.Message(topic="t", message_group="g\x01"), [b"a", b"b", b""], ["a", "b", "c"]),
        (pb.Message(topic="t", queue_id=99), [b"a"], ["\x02"]),
        (pb.Message(topic="t", tag="x"), [b"a", b"", b"c"], ["a", "b", "\x02"]),
    ],
)
async def test_a_bad_run_is_refused_as_its_messages_sent_one_by_one(
    tmp_path: Path, shared: pb.Message, bodies: list[bytes], ids: list[str]
) -> None:
    """Two violations: the error the first bad message gets, whichever way its messages come."""
    one_by_one = []
    for body, message_id in zip(bodies, ids, strict=True):
        m = pb.Message()
        m.CopyFrom(shared)
        m.body, m.message_id = body, message_id
        one_by_one.append(m)
    run = pb.SharedRun(shared=shared, bodies=bodies, message_ids=ids)
    alone = await refusal(tmp_path / "messages", pb.SendRequest(messages=one_by_one))
    assert await refusal(tmp_path / "run", pb.SendRequest(runs=[run])) is alone


async def test_a_send_of_more_runs_than_messages_it_may_carry_is_refused_by_its_count(tmp_path: Path) -> None:
    empty = pb.SharedRun(shared=pb.Message(topic="t"))
    request = pb.SendRequest(runs=[empty] * 100_000)  # each run costs a few bytes: refused before any is read
    async with broker(tmp_path) as (core, _):
        with pytest.raises(errors.IllegalBatchSize, match="100000 runs"):
            await handlers.send(core, request, pb.SendResponse())


async def test_a_runs_shared_part_counts_once_a_message_against_the_budget(tmp_path: Path) -> None:
    """A 27 KB request whose run shares 16 KB of keys and properties among 1,024 one-byte bodies becomes ~17 MB of
    payloads: counted so, it is refused (TooManyRequests) past --max-send-bytes while another Send is in flight (a
    Send alone always fits), and stores nothing."""
    shared = pb.Message(topic="t", keys=["k" * 256] * 63)
    shared.properties["p"] = "v" * 250
    run = pb.SharedRun(shared=shared, bodies=[b"x"] * 1024, message_ids=[f"id{i}" for i in range(1024)])
    request = pb.SendRequest(runs=[run])
    assert request.ByteSize() < 64 * 1024
    async with broker(tmp_path, max_send_bytes=8 << 20) as (core, _):
        another = core.sends.in_flight.take(1024)  # a Send in flight meanwhile
        with pytest.raises(errors.TooManyRequests):
            await handlers.send(core, request, pb.SendResponse())
        assert core.sends.in_flight.used == another
        assert await stored(core, "t") == []
