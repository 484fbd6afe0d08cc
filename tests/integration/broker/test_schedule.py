"""Delayed and scheduled delivery through a real broker process."""

from __future__ import annotations

import time

import grpc
import pytest
from popgate_pb import broker_pb2 as pb

from tests.conftest import BrokerHandle
from tests.integration.broker.test_broker import error_name, pop, send


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_delay_level_is_invisible_until_due_then_wakes_a_held_pop(broker_without_sweep: BrokerHandle) -> None:
    broker = broker_without_sweep  # no safety sweep: only the delivery coming due wakes the held Pop in time
    sent_at = now_ms()
    [result] = send(broker.stub, "later", [b"lvl1"], delay_level=1).results
    assert result.offset == -1 and result.message_id
    assert pop(broker.stub, "later", "g") == []
    got = pop(broker.stub, "later", "g", poll_ms=5000)
    received = now_ms()
    assert [m.stored.message.body for m in got] == [b"lvl1"]
    assert got[0].stored.message.message_id == result.message_id
    assert received - sent_at >= 1000  # never early
    assert received - sent_at < 3000


def test_past_timestamp_delivers_at_once_and_too_far_is_refused(broker: BrokerHandle) -> None:
    send(broker.stub, "t", [b"past"], deliver_at_ms=now_ms() - 60_000)
    assert [m.stored.message.body for m in pop(broker.stub, "t", "g")] == [b"past"]
    for fields in ({"deliver_at_ms": now_ms() + 4 * 24 * 3600 * 1000}, {"delay_level": 19}):
        with pytest.raises(grpc.RpcError) as info:
            send(broker.stub, "t", [b"x"], **fields)  # type: ignore[arg-type]
        assert error_name(info.value) == "IllegalDeliveryTime"
        assert "delay" in info.value.details()  # type: ignore[attr-defined]


def test_scheduled_messages_survive_kill_9_and_are_delivered_exactly_once(make_broker: object) -> None:
    b: BrokerHandle = make_broker("b1")  # type: ignore[operator]
    due_soon = now_ms() + 300  # comes due while the broker is down
    due_later = now_ms() + 4000  # comes due after the restart
    send(b.stub, "sched", [b"soon-%d" % i for i in range(20)], deliver_at_ms=due_soon)
    send(b.stub, "sched", [b"later-%d" % i for i in range(20)], deliver_at_ms=due_later)
    b.proc.kill()
    time.sleep(max(0.0, (due_soon + 200 - now_ms()) / 1000))  # the first batch comes due while no broker runs
    b.restart()
    bodies: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(bodies) < 40 and time.monotonic() < deadline:
        for m in pop(b.stub, "sched", "g", poll_ms=2000):
            bodies.append(m.stored.message.body)
            assert now_ms() >= (due_soon if m.stored.message.body.startswith(b"soon") else due_later)
    assert sorted(bodies) == sorted([b"soon-%d" % i for i in range(20)] + [b"later-%d" % i for i in range(20)])
    b.restart(kill=True)
    assert pop(b.stub, "sched", "other", poll_ms=500, n=32) != []  # still in the topic for other groups
    rows = b.stub.Stats(pb.StatsRequest(topic="sched", group="other")).groups
    assert sum(r.max_offset for r in rows) == 40  # not delivered twice
