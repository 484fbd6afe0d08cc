"""The protocol-neutral core over in-memory brokers: routing, send, fail-over (receive and ack: test_core_receive)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy import routing
from proxy.core import Proxy
from proxy.outgoing import Chunk
from proxy.receive.coupled import LongPollStrategy
from proxy.receive.seam import ReceiveRequest
from proxy.routing import BrokerPool
from proxy.sending import PartlyStored
from tests.unit.proxy.fakes import FakeBroker, handle, popped


def make(*names: str) -> tuple[Proxy, dict[str, FakeBroker]]:
    brokers = {n: FakeBroker(n) for n in names}
    pool = BrokerPool(brokers, first_turn=0)
    return Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), queues_per_broker=4), brokers


def msg(i: int, group: str = "") -> bpb.Message:
    return bpb.Message(topic="t", message_id=f"m{i}", body=b"x", message_group=group)


def request(poll_s: float = 0.0, deadline_in: float = 5.0) -> ReceiveRequest:
    loop = asyncio.get_running_loop()
    return ReceiveRequest("t", "g", "*", 32, 30_000, poll_s, loop.time() + deadline_in)


def test_route_lists_queues_on_every_live_broker_only() -> None:
    proxy, brokers = make("b1", "b2", "b3")
    brokers["b2"].healthy = False
    assert {(q.broker, q.queue_id) for q in proxy.route()} == {(b, q) for b in ("b1", "b3") for q in range(4)}
    for b in brokers.values():
        b.healthy = False
    with pytest.raises(errors.BrokerUnavailable, match="no broker is live"):
        proxy.route()


async def test_sends_rotate_over_brokers_and_keep_request_order() -> None:
    proxy, brokers = make("b1", "b2")
    for i in range(4):
        results = await proxy.send([msg(i)])
        assert results[0].message_id == f"m{i}"
    assert [m.message_id for m in brokers["b1"].sent] == ["m0", "m2"]
    assert [m.message_id for m in brokers["b2"].sent] == ["m1", "m3"]


async def test_a_message_group_always_lands_on_one_broker() -> None:
    proxy, brokers = make("b1", "b2", "b3")
    for i in range(9):
        await proxy.send([msg(i, group="order-42")])
    assert sorted(len(b.sent) for b in brokers.values()) == [0, 0, 9]


async def test_a_message_group_stays_on_its_broker_while_another_broker_is_down() -> None:
    """Its order holds: only the loss of its own broker moves a group (a hash over the live brokers moved about
    half of all groups whenever any broker's health changed, and back again after)."""
    names = ("b1", "b2", "b3", "b4")
    groups = [f"order-{i}" for i in range(40)]

    async def homes(down: str | None) -> dict[str, str]:
        proxy, brokers = make(*names)
        if down is not None:
            brokers[down].healthy = False
        for i, group in enumerate(groups):
            await proxy.send([msg(i, group=group)])
        return {m.message_group: name for name, b in brokers.items() for m in b.sent}

    before = await homes(None)
    assert len(set(before.values())) == len(names), "the groups are not spread over the brokers"
    for down in names:
        after = await homes(down)
        moved = {g for g in groups if after[g] != before[g]}
        assert moved == {g for g in groups if before[g] == down}


async def test_a_requests_message_groups_share_a_send_per_broker() -> None:
    """A request of 300 message groups over 3 brokers: each group's messages on its own broker in their order, in
    at most 6 broker Sends (one per order the brokers come in), not 300."""
    proxy, brokers = make("b1", "b2", "b3")
    sends: list[str] = []
    for name, broker in brokers.items():

        async def counted(chunk: Chunk, *, timeout_s: float, name: str = name, send: Any = broker.send) -> Any:
            sends.append(name)
            return await send(chunk, timeout_s=timeout_s)

        broker.send = counted  # type: ignore[method-assign]
    batch = [msg(i, group=f"order-{i % 300}") for i in range(600)]
    results = await proxy.send(batch)
    assert [r.message_id for r in results] == [m.message_id for m in batch]
    assert len(sends) <= 6 and set(sends) == set(brokers)
    for name, broker in brokers.items():
        assert {m.message_group for m in broker.sent} == {
            f"order-{i}" for i in range(300) if proxy.pool.candidates(f"order-{i}")[0].name == name
        }
    for i in range(300):  # each group's two messages in the order sent
        stored = [m.message_id for b in brokers.values() for m in b.sent if m.message_group == f"order-{i}"]
        assert stored == [f"m{i}", f"m{i + 300}"]


def test_message_groups_spread_evenly_and_a_lost_brokers_groups_spread_over_the_others() -> None:
    names = [f"b{i}" for i in range(1, 7)]
    pool = BrokerPool({n: FakeBroker(n) for n in names}, first_turn=0)
    order = [[c.name for c in pool.candidates(f"order-{i}")] for i in range(6000)]
    shares = Counter(o[0] for o in order)
    assert all(abs(shares[n] / 6000 - 1 / 6) < 0.03 for n in names), shares
    for lost in names:
        heirs = Counter(o[1] for o in order if o[0] == lost)
        assert all(heirs[n] / shares[lost] > 0.12 for n in names if n != lost), (lost, heirs)  # 1/5 expected


async def test_send_fails_over_when_a_broker_is_unavailable() -> None:
    proxy, brokers = make("b1", "b2")
    brokers["b1"].fail = errors.BrokerUnavailable("b1 down")
    for i in range(3):
        await proxy.send([msg(i)])
    assert len(brokers["b2"].sent) == 3


async def test_send_fails_over_from_a_broker_whose_store_refuses_writes() -> None:
    """A full or read-only disk: the broker's commit stored nothing (rolled back), and its health stays SERVING.
    Its sends go to another broker, a FIFO group's too, rather than failing while other brokers are live."""
    proxy, brokers = make("b1", "b2")
    brokers["b1"].fail = errors.StoreUnavailable("store write failed (data directory full or read-only?)")
    group = next(f"g{i}" for i in range(100) if proxy.pool.candidates(f"g{i}")[0].name == "b1")
    for i in range(3):
        await proxy.send([msg(i)])
    await proxy.send([msg(3, group=group)])
    assert len(brokers["b2"].sent) == 4


async def test_sends_failing_over_log_a_line_per_broker_and_reason_not_per_send(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer looping on sends that fail over (a topic missing on a broker, its disk full) does not grow the
    proxy's log with its send rate: one line per broker and reason, then at most one every 10 s with a count."""
    proxy, brokers = make("b1", "b2", "b3")
    brokers["b1"].fail = errors.StoreUnavailable("store write failed (data directory full or read-only?)")
    brokers["b2"].fail = errors.BrokerUnavailable("b2 is down")
    caplog.set_level(logging.INFO, logger="proxy.sending")
    for i in range(200):
        await proxy.send([msg(i, group=f"g{i}")])
    assert len(brokers["b3"].sent) == 200
    lines = [r.getMessage() for r in caplog.records if "failed over" in r.getMessage()]
    assert sorted(line.split(":")[0] for line in lines) == [
        "send to broker b1 failed over",
        "send to broker b2 failed over",
    ]


async def test_send_does_not_fail_over_on_a_bad_request() -> None:
    proxy, brokers = make("b1", "b2")
    brokers["b1"].fail = errors.MessageBodyTooLarge("too big")
    with pytest.raises(errors.MessageBodyTooLarge):
        await proxy.send([msg(1)])
    assert brokers["b2"].sent == []


async def test_a_failed_send_answers_once_every_message_group_of_the_request_has_settled() -> None:
    """One group's broker refuses while another group's store is still in flight: the error is answered only
    after that store ends, so a client retrying the request does not race it, and the request's bytes stay
    counted against max_send_bytes until then."""
    proxy, brokers = make("b1", "b2")
    on = {proxy.pool.candidates(f"k{i}")[0].name: f"k{i}" for i in range(20)}  # a message group for each broker
    brokers["b1"].fail = errors.MessageBodyTooLarge("too big")
    slow_send = brokers["b2"].send
    in_flight: list[int] = []

    async def slow(chunk: Chunk, *, timeout_s: float) -> Sequence[bpb.SendResult]:
        in_flight.append(proxy.sender.in_flight_bytes)
        await asyncio.sleep(0.05)
        return await slow_send(chunk, timeout_s=timeout_s)

    brokers["b2"].send = slow  # type: ignore[method-assign]
    with pytest.raises(PartlyStored) as partly:
        await proxy.send([msg(1, on["b1"]), msg(2, on["b2"])])
    assert [m.message_id for m in brokers["b2"].sent] == ["m2"]  # settled before the answer
    assert isinstance(partly.value.error, errors.MessageBodyTooLarge)  # the client is told this, and which
    assert [r is not None for r in partly.value.results] == [False, True]  # is stored
    assert in_flight and in_flight[0] > 0 and proxy.sender.in_flight_bytes == 0


async def broker_sends(batch: list[bpb.Message], budget: int) -> list[int]:
    """How many messages each broker Send carries when the proxy sends `batch` with this budget."""
    brokers = {"b1": FakeBroker("b1")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), send_chunk_bytes=budget)
    sent_calls: list[int] = []
    original = brokers["b1"].send

    async def counting(chunk: Chunk, *, timeout_s: float) -> Sequence[bpb.SendResult]:
        sent_calls.append(len(chunk.places))
        return await original(chunk, timeout_s=timeout_s)

    brokers["b1"].send = counting  # type: ignore[method-assign]
    results = await proxy.send(batch)
    assert [r.message_id for r in results] == [m.message_id for m in batch]
    return sent_calls


async def test_large_batches_are_split_into_broker_sends_under_the_byte_budget() -> None:
    batch = [bpb.Message(topic="t", message_id=f"m{i}", body=b"x" * 4) for i in range(7)]
    two = 2 * (batch[0].ByteSize() + 8)
    assert await broker_sends(batch, two) == [2, 2, 2, 1]


async def test_the_budget_counts_properties_not_only_bodies() -> None:
    # ~16 KB of properties and a 1-byte body each: by bodies alone all 8 would go in one 64 KiB Send
    props = {f"k{j}": "v" * 1000 for j in range(16)}
    batch = [bpb.Message(topic="t", message_id=f"m{i}", body=b"x", properties=props) for i in range(8)]
    assert await broker_sends(batch, 64 * 1024) == [4, 4]


async def test_send_and_receive_go_on_to_a_broker_that_has_the_topic() -> None:
    # Topics created on some brokers only (brokers with --no-auto-create and --topic).
    proxy, brokers = make("b1", "b2")
    brokers["b1"].fail = errors.TopicNotFound("topic t does not exist on broker b1")
    brokers["b2"].ready = [popped("b2", "x")]
    await proxy.send([msg(1)])
    result = len((await proxy.receive(request())).messages)
    assert result == 1
    assert len(brokers["b2"].sent) == 1


class LacksTopic(FakeBroker):
    """A broker with --no-auto-create that does not hold topic t: counts the sends it refused."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.refused = 0

    async def send(self, chunk: Chunk, *, timeout_s: float) -> Sequence[bpb.SendResult]:
        self.refused += 1
        raise errors.TopicNotFound(f"topic t does not exist on broker {self.name}")


async def test_a_broker_that_lacks_the_topic_is_tried_last_for_it() -> None:
    brokers: dict[str, FakeBroker] = {"b1": LacksTopic("b1"), "b2": FakeBroker("b2"), "b3": FakeBroker("b3")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0))
    for i in range(30):
        await proxy.send([msg(i)])
    lacking = brokers["b1"]
    assert isinstance(lacking, LacksTopic) and lacking.refused == 1  # once, not a third of the sends
    assert len(brokers["b2"].sent) + len(brokers["b3"].sent) == 30
    assert len(brokers["b2"].sent) >= 10 and len(brokers["b3"].sent) >= 10  # still spread over the others


async def test_a_topic_no_broker_has_is_topic_not_found() -> None:
    proxy, brokers = make("b1", "b2")
    for b in brokers.values():
        b.fail = errors.TopicNotFound(f"topic t does not exist on broker {b.name}")
    with pytest.raises(errors.TopicNotFound) as missing:
        await proxy.send([msg(1)])
    # every broker was asked: not named after the last one alone (a review found that misleading)
    assert missing.value.message == "topic t exists on none of the 2 live brokers (auto-create is off)"
    with pytest.raises(errors.TopicNotFound):
        await proxy.receive(request())


async def test_send_with_every_broker_down_is_broker_unavailable() -> None:
    proxy, brokers = make("b1", "b2")
    for b in brokers.values():
        b.fail = errors.BrokerUnavailable(f"{b.name} down")
    with pytest.raises(errors.BrokerUnavailable):
        await proxy.send([msg(1)])


def test_each_pool_starts_its_rotation_at_a_random_broker() -> None:
    names = [f"b{i}" for i in range(8)]
    firsts = {BrokerPool({n: FakeBroker(n) for n in names}).candidates()[0].name for _ in range(64)}
    assert len(firsts) > 1  # 64 pools all starting on one of 8 brokers: probability 8 / 8**64


async def test_broker_calls_end_before_the_clients_deadline() -> None:
    """The proxy answers (PROXY_TIMEOUT at worst) before the client gives up, not at the same moment."""
    timeouts: list[float] = []
    proxy, brokers = make("b1")
    original_ack, original_send = brokers["b1"].ack, brokers["b1"].send

    async def ack(request: bpb.AckRequest, *, timeout_s: float) -> bpb.AckResponse:
        timeouts.append(timeout_s)
        return await original_ack(request, timeout_s=timeout_s)

    async def send(chunk: Chunk, *, timeout_s: float) -> Sequence[bpb.SendResult]:
        timeouts.append(timeout_s)
        return await original_send(chunk, timeout_s=timeout_s)

    brokers["b1"].ack, brokers["b1"].send = ack, send  # type: ignore[method-assign]
    now = asyncio.get_running_loop().time()
    await proxy.ack("t", "g", [handle("b1")], deadline=now + 0.5)
    await proxy.send([msg(1)], deadline=now + 0.5)
    await proxy.ack("t", "g", [handle("b1")])  # no client deadline: the broker timeout
    assert all(t <= 0.41 for t in timeouts[:2]) and timeouts[2] == 3.0  # the default broker_timeout_s


async def test_a_handle_whose_ack_failed_retriably_goes_on_being_renewed() -> None:
    """An auto_renew handle's renewal stops once its ack is answered, but not when the ack failed retriably (a
    broker timing out): the client acks again later, and meanwhile the message must stay invisible."""
    proxy, brokers = make("b1")
    forgotten: list[str] = []
    proxy.renewer.forget = forgotten.extend  # type: ignore[method-assign,assignment]
    brokers["b1"].fail = errors.BrokerTimeout("broker b1 did not answer in time")
    [failed] = await proxy.ack("t", "g", [handle("b1")])
    assert isinstance(failed, errors.BrokerTimeout) and forgotten == []
    brokers["b1"].fail = None
    assert await proxy.ack("t", "g", [handle("b1")]) == [None] and forgotten == [handle("b1")]


def test_rotations_dropped_as_the_longest_unused_start_again_at_a_random_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More groups receiving in turn than rotations kept: each rotation is dropped before its next use, and starts
    again at a random broker, not at the pool's first broker each time (which would send every such group's
    receives to one broker first, a backlog elsewhere never polled)."""
    monkeypatch.setattr(routing, "MAX_ROTATIONS", 2)
    pool = BrokerPool({n: FakeBroker(n) for n in ("b1", "b2", "b3")})
    firsts: dict[str, set[str]] = {g: set() for g in "abc"}
    for _ in range(40):
        for group in "abc":
            firsts[group].add(pool.candidates(rotation=group)[0].name)
    assert all(len(brokers) > 1 for brokers in firsts.values())


async def test_a_send_one_store_refused_is_said_so_not_missing() -> None:
    """The topic on b1 alone, b1's disk full: each send, whichever broker it tries first, is told the store
    refused it (retriable), not b2's "does not exist"."""
    proxy, brokers = make("b1", "b2")
    brokers["b1"].fail = errors.StoreUnavailable("store write failed (data directory full or read-only?)")
    brokers["b2"].fail = errors.TopicNotFound("topic t does not exist on broker b2 and auto-create is off")
    for i in range(4):
        with pytest.raises(errors.StoreUnavailable, match="store write failed"):
            await proxy.send([msg(i)])


async def test_a_topic_being_deleted_is_said_so_not_missing() -> None:
    """Brokers that make topics on a send (auto-create) refuse one they are deleting: the send is told that, not
    that auto-create is off."""
    proxy, brokers = make("b1", "b2")
    brokers["b1"].fail = errors.TopicNotFound("topic t is being deleted on broker b1")
    brokers["b2"].fail = errors.TopicNotFound("topic t does not exist on broker b2")
    with pytest.raises(errors.TopicNotFound, match="is being deleted on broker b1"):
        await proxy.send([msg(1)])
