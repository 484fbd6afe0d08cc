"""The protocol-neutral core over in-memory brokers: receive (fail-over, limits, closing) and ack."""

from __future__ import annotations

import asyncio

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.core import Proxy
from proxy.receive.coupled import LongPollStrategy
from proxy.routing import BrokerPool
from tests.unit.proxy.fakes import FakeBroker, handle, popped
from tests.unit.proxy.test_core import make, request


async def test_receive_pops_one_broker_with_the_poll_time_and_rotates() -> None:
    proxy, brokers = make("b1", "b2")
    brokers["b2"].ready = [popped("b2", "x")]
    first = await proxy.receive(request(poll_s=0.05))
    second = await proxy.receive(request(poll_s=0.05))
    result = [first.outcome, second.outcome]
    assert result == ["empty", "messages"]
    assert brokers["b1"].pops[0].poll_ms == 50 and brokers["b1"].pops[0].max_messages == 32


async def test_receive_skips_a_broker_that_turns_out_to_be_down() -> None:
    proxy, brokers = make("b1", "b2")
    brokers["b1"].fail = errors.BrokerUnavailable("gone")
    brokers["b2"].ready = [popped("b2", "x")]
    result = len((await proxy.receive(request())).messages)
    assert result == 1


class DiesWhileHolding(FakeBroker):
    """Holds a Pop for `after_s`, then fails as a broker killed mid-poll does."""

    def __init__(self, name: str, after_s: float) -> None:
        super().__init__(name)
        self.after_s = after_s

    async def pop(self, request: bpb.PopRequest, *, timeout_s: float) -> bpb.PopResponse:
        self.pops.append(request)
        await asyncio.sleep(self.after_s)
        raise errors.BrokerUnavailable(f"{self.name} went away")


class Hangs(FakeBroker):
    """Never answers: the call ends with the client-side timeout it was given."""

    async def pop(self, request: bpb.PopRequest, *, timeout_s: float) -> bpb.PopResponse:
        self.pops.append(request)
        await asyncio.sleep(timeout_s)
        raise errors.BrokerTimeout(f"broker {self.name} did not answer in time")


async def test_after_a_fail_over_the_next_broker_gets_only_the_poll_time_left() -> None:
    brokers: dict[str, FakeBroker] = {"b1": DiesWhileHolding("b1", after_s=0.3), "b2": FakeBroker("b2")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0))
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await proxy.receive(request(poll_s=1.0, deadline_in=1.5))
    outcome, took = result.outcome, loop.time() - started
    assert outcome == "empty"
    assert brokers["b1"].pops[0].poll_ms == 1000
    assert 0 < brokers["b2"].pops[0].poll_ms <= 750  # not the whole second again
    assert took < 1.5  # answered inside the client's deadline (at the end of its poll)


async def test_a_broker_that_hangs_until_the_deadline_gives_an_empty_answer_not_an_error() -> None:
    brokers: dict[str, FakeBroker] = {"b1": Hangs("b1")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0))
    result = (await proxy.receive(request(poll_s=0.5, deadline_in=0.6))).outcome
    assert result == "empty"


async def test_a_receive_with_no_time_left_for_a_broker_call_is_empty_not_an_error() -> None:
    proxy, _ = make("b1")
    result = (await proxy.receive(request(poll_s=0.0, deadline_in=0.01))).outcome
    assert result == "empty"


async def test_a_full_broker_is_too_many_requests() -> None:
    proxy, brokers = make("b1")
    brokers["b1"].polling_full = True
    with pytest.raises(errors.TooManyRequests):
        await proxy.receive(request(poll_s=1.0))


async def test_receives_beyond_the_held_limit_are_too_many_requests() -> None:
    brokers = {"b1": FakeBroker("b1")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), max_held_receives=2)
    held = [asyncio.create_task(proxy.receive(request(poll_s=0.3))) for _ in range(2)]
    await asyncio.sleep(0)  # both reach the broker and wait there
    with pytest.raises(errors.TooManyRequests, match="already holds 2"):
        await proxy.receive(request(poll_s=0.3))
    result = [r.outcome for r in await asyncio.gather(*held)]
    assert result == ["empty", "empty"]


async def test_an_answer_its_client_has_not_read_still_counts_against_the_limits() -> None:
    """A receive with messages stays held until its caller releases the answer (written to the client, or
    the client gone): clients that never read cannot make the proxy keep answers without bound."""
    brokers = {"b1": FakeBroker("b1")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), max_held_receives=2, max_answer_bytes=2000)
    brokers["b1"].put(popped("b1", "m0"), popped("b1", "m1"))
    answered = await proxy.receive(request(poll_s=0.0))  # 2 messages, not written yet
    assert len(answered.messages) == 2
    with pytest.raises(errors.TooManyRequests, match="not read"):  # 2 x (body + 1 KiB) >= 2000 bytes
        await proxy.receive(request(poll_s=0.0))
    answered.release()
    answered.release()  # once only
    brokers["b1"].put(popped("b1", "m2"))
    first = await proxy.receive(request(poll_s=0.0))
    second = await proxy.receive(request(poll_s=0.0))  # empty: counted only while it runs
    assert len(first.messages) == 1 and not second.messages
    held = asyncio.create_task(proxy.receive(request(poll_s=0.3)))
    await asyncio.sleep(0)  # it waits at the broker; with `first` not written, the proxy holds 2
    with pytest.raises(errors.TooManyRequests, match="already holds 2"):
        await proxy.receive(request(poll_s=0.3))
    first.release()
    await held


async def test_an_answer_past_its_write_deadline_counts_only_the_frame_grpc_still_holds() -> None:
    """Given back at its write deadline (its client does not read), an answer keeps counting only the message grpc
    is stuck writing, until it is released when the call ends."""
    brokers = {"b1": FakeBroker("b1")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), max_answer_bytes=3100)
    brokers["b1"].put(popped("b1", "m0"), popped("b1", "m1"))
    lazy = await proxy.receive(request(poll_s=0.0))  # 2 x (a few bytes + 1 KiB)
    brokers["b1"].put(popped("b1", "m2"), popped("b1", "m3"))
    with pytest.raises(errors.TooManyRequests, match="not read"):
        await proxy.receive(request(poll_s=0.0))  # given back to b1: m2 and m3 ready again
    lazy.keep_only(range(1))  # the deadline passed while grpc wrote message 0
    lazy.keep_only(range(1))  # (idempotent)
    assert len((await proxy.receive(request(poll_s=0.0))).messages) == 2  # 1 + 2 messages fit now
    lazy.release()


async def test_a_receive_held_before_the_answer_limit_and_answered_after_it_gives_its_messages_back() -> None:
    brokers = {n: FakeBroker(n) for n in ("b1", "b2")}
    pool = BrokerPool(brokers, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), max_answer_bytes=2000)
    held = asyncio.create_task(proxy.receive(request(poll_s=2.0)))
    await asyncio.sleep(0)  # it waits at b1
    brokers["b2"].put(popped("b2", "m0"), popped("b2", "m1"))
    unread = await proxy.receive(request(poll_s=0.0))  # from b2 (b1 holds one): 2 messages, not written yet
    assert len(unread.messages) == 2
    brokers["b1"].put(popped("b1", "late"))
    with pytest.raises(errors.TooManyRequests, match="not read"):
        await held
    assert [m.stored.message.message_id for m in brokers["b1"].ready] == ["late"], "not given back"
    unread.release()
    again = await proxy.receive(request(poll_s=0.0))
    assert [m.stored.message.message_id for m in again.messages] == ["late"]
    again.release()


async def test_closing_answers_a_held_receive_at_once() -> None:
    proxy, _ = make("b1")
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(proxy.receive(request(poll_s=10.0, deadline_in=20)))
    await asyncio.sleep(0)  # let the receive reach the broker
    proxy.close()
    result = await asyncio.wait_for(task, 2)
    outcome, took = result.outcome, loop.time() - started
    assert outcome == "closing" and took < 2


async def test_ack_routes_each_handle_to_its_broker_and_reports_per_handle() -> None:
    proxy, brokers = make("b1", "b2")
    handles = [handle("b1"), handle("b2"), "garbage", handle("b9"), handle("b2", token="5a1e")]
    outcome = await proxy.ack("t", "g", handles)
    assert outcome[0] is None and outcome[1] is None
    assert isinstance(outcome[2], errors.InvalidReceiptHandle)
    assert isinstance(outcome[3], errors.InvalidReceiptHandle) and "b9" in outcome[3].message
    assert isinstance(outcome[4], errors.InvalidReceiptHandle)
    assert [list(a.receipt_handles) for a in brokers["b1"].acks] == [[handles[0]]]
    assert [list(a.receipt_handles) for a in brokers["b2"].acks] == [[handles[1], handles[4]]]


async def test_ack_at_a_down_broker_is_an_error_for_its_handles_only() -> None:
    proxy, brokers = make("b1", "b2")
    brokers["b1"].fail = errors.BrokerUnavailable("b1 down")
    outcome = await proxy.ack("t", "g", [handle("b1"), handle("b2")])
    assert isinstance(outcome[0], errors.BrokerUnavailable) and outcome[1] is None


async def test_change_invisible_and_dead_letter_go_to_the_handles_broker() -> None:
    proxy, _ = make("b1", "b2")
    assert await proxy.change_invisible("t", "g", handle("b2"), 1000) == handle("b2") + "-new"
    await proxy.dead_letter("t", "g", handle("b1"))
    with pytest.raises(errors.InvalidReceiptHandle):
        await proxy.change_invisible("t", "g", "nonsense", 1000)
