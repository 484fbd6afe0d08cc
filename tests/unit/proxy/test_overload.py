"""Sends in flight are bounded in bytes: past the bound TOO_MANY_REQUESTS, never unbounded memory (proxy/sending.py)."""

from __future__ import annotations

import asyncio
import gzip
import os
import threading
import tracemalloc
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from popgate_contract.codes import code_of
from proxy.auth import Account
from proxy.core import REPLY_RESERVE_S, Proxy
from proxy.outgoing import Chunk
from proxy.receive.coupled import LongPollStrategy
from proxy.routing import BrokerPool
from proxy.sending import SEND_OVERHEAD
from proxy.settings import BrokerAddress, Settings
from proxy.v2 import send as send_v2
from proxy.v2.context import Call, endpoints_for
from proxy.v2.session import StreamAccount
from tests.unit.proxy.fakes import FakeBroker
from tests.unit.proxy.test_session import service_over


class SlowBroker(FakeBroker):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.release = asyncio.Event()
        self.waiting = 0
        self.all_waiting = asyncio.Event()
        self.one_waiting = asyncio.Event()

    async def send(self, chunk: Chunk, *, timeout_s: float) -> Sequence[bpb.SendResult]:
        self.waiting += 1
        self.one_waiting.set()
        if self.waiting == 3:
            self.all_waiting.set()
        await self.release.wait()
        return await super().send(chunk, timeout_s=timeout_s)


def message(size: int) -> bpb.Message:
    return bpb.Message(topic="t", message_id=f"m{size}", body=b"x" * size)


HELD_1000 = message(1000).ByteSize() + SEND_OVERHEAD  # what a send of one `message(1000)` counts: encoded whole


async def test_sends_beyond_the_bytes_in_flight_are_too_many_requests_and_the_budget_comes_back() -> None:
    broker = SlowBroker("b1")
    pool = BrokerPool({"b1": broker})
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), max_send_bytes=3 * HELD_1000)
    held = [asyncio.create_task(proxy.send([message(1000)])) for _ in range(3)]
    async with asyncio.timeout(5):
        await broker.all_waiting.wait()
    with pytest.raises(errors.TooManyRequests, match="in flight") as caught:
        await proxy.send([message(1)])
    assert code_of(caught.value) == v2.TOO_MANY_REQUESTS
    broker.release.set()
    assert all(len(r) == 1 for r in await asyncio.gather(*held))
    assert len(await proxy.send([message(1000)] * 3)) == 3  # the budget was given back


async def test_sends_count_their_keys_and_properties_not_their_bodies_alone() -> None:
    """A message of a one-byte body with 16 KiB of keys and properties (63 keys of 256 characters, the most a
    message may carry) holds ~16 KB: sends of them count so, and past the bound are refused (TooManyRequests) while
    others are in flight, at the edge (a v2 SendMessage) and once converted alike."""
    broker = SlowBroker("b1")
    pool = BrokerPool({"b1": broker})
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), max_send_bytes=1 << 20)
    heavy = bpb.Message(topic="t", message_id="m", body=b"x", keys=["k" * 256] * 63, properties={"p": "v" * 250})
    held = asyncio.create_task(proxy.send([heavy] * 32))  # ~0.5 MB held (its bodies: 32 bytes)
    async with asyncio.timeout(5):
        await broker.one_waiting.wait()
    sent = v2.Message(topic=v2.Resource(name="t"), body=b"x", user_properties={"p": "v" * 250})
    sent.system_properties.keys.extend(["k" * 256] * 63)
    with pytest.raises(errors.TooManyRequests, match="in flight"):
        proxy.check_send_room([sent] * 32)
    with pytest.raises(errors.TooManyRequests, match="in flight"):
        await proxy.send([heavy] * 32)
    broker.release.set()
    assert len(await held) == 32
    assert len(await proxy.send([heavy] * 32)) == 32  # the budget was given back


async def test_one_request_larger_than_the_bound_still_goes_through_alone() -> None:
    broker = FakeBroker("b1")
    pool = BrokerPool({"b1": broker})
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), max_send_bytes=1024)
    assert len(await proxy.send([message(10_000)])) == 1


async def test_a_send_refused_for_room_is_refused_before_its_bodies_are_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    converted: list[int] = []
    real = send_v2.to_broker

    def counting(*args: Any, **kwargs: Any) -> bpb.Message:
        converted.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(send_v2, "to_broker", counting)
    broker = SlowBroker("b1")
    pool = BrokerPool({"b1": broker})
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), max_send_bytes=3 * HELD_1000)
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    call = Call(proxy, settings, endpoints_for("127.0.0.1:1"), None)
    held = [asyncio.create_task(proxy.send([message(1000)])) for _ in range(3)]
    async with asyncio.timeout(5):
        await broker.all_waiting.wait()
    request = pb.SendMessageRequest(messages=[v2_message(1000) for _ in range(8)])
    with pytest.raises(errors.TooManyRequests, match="in flight"):
        await send_v2.send_message(call, request, inflation=send_v2.Inflation())
    assert converted == []
    broker.release.set()
    await asyncio.gather(*held)


@pytest.mark.parametrize(
    "account", [None, StreamAccount(Account("ak", "sk", publish=("*",)))], ids=["open", "accounts"]
)
async def test_a_send_of_too_many_messages_is_refused_by_its_count_before_they_are_read(
    account: StreamAccount | None,
) -> None:
    """300,000 messages naming only a topic (a 2.1 MB request): refused without a Python object made per message
    (with accounts, before their topics are read for permissions too)."""
    one = pb.SendMessageRequest(messages=[v2.Message(topic=v2.Resource(name="t"))]).SerializeToString()
    request = pb.SendMessageRequest.FromString(one * 300_000)  # parsed as the server parses it
    broker = FakeBroker("b1")
    service = service_over(broker)[0]
    context = SimpleNamespace(invocation_metadata=lambda: (), time_remaining=lambda: 3.0)
    tracemalloc.start()
    try:
        answer = await service.SendMessage(request, context, account)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (answer.status.code, answer.status.message) == (
        v2.BAD_REQUEST,
        "SendMessage carries 300000 messages: must be 1..1024",
    )
    assert peak < 1 << 20  # an object per message read would be tens of MB
    assert broker.sent == []


def v2_message(size: int) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name="t"), body=b"x" * size)
    m.system_properties.message_id = "01" + "0" * 30
    m.system_properties.body_encoding = v2.IDENTITY
    m.system_properties.message_type = v2.NORMAL
    return m


async def test_gzip_bodies_of_one_request_inflate_to_no_more_than_the_largest_request_and_nothing_is_stored() -> None:
    """A 4 KB gzip of 4 MiB of zeros per message: 40 of them (160 KB sent) would be 160 MiB in the proxy."""
    bomb = gzip.compress(b"\0" * 4 * 1024 * 1024, 9)
    broker = FakeBroker("b1")
    pool = BrokerPool({"b1": broker})
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0))
    settings = Settings(
        brokers=(BrokerAddress("b1", "127.0.0.1:1"),), max_body_bytes=5 * 1024 * 1024, max_message_bytes=16 << 20
    )
    call = Call(proxy, settings, endpoints_for("127.0.0.1:1"), None)
    inflation = send_v2.Inflation()
    messages = [v2_message(1) for _ in range(40)]
    for m in messages:
        m.body, m.system_properties.body_encoding = bomb, v2.GZIP
    with pytest.raises(errors.MessageBodyTooLarge, match="inflate to more than the largest request") as caught:
        await send_v2.send_message(call, pb.SendMessageRequest(messages=messages), inflation=inflation)
    assert code_of(caught.value) == v2.MESSAGE_BODY_TOO_LARGE
    assert broker.sent == []
    # Within the bound they are taken: 3 x 4 MiB < 16 MiB.
    reply = await send_v2.send_message(call, pb.SendMessageRequest(messages=messages[:3]), inflation=inflation)
    assert reply.status.code == v2.OK and [len(m.body) for m in broker.sent] == [4 * 1024 * 1024] * 3


async def test_gzip_conversions_past_the_bound_wait_within_their_deadline_until_their_threads_finish() -> None:
    """A conversion's place comes back when its thread is done, not when its client gives up waiting; a request
    waits for one until its deadline, and past the bound of waiters it is refused at once."""
    release = threading.Event()
    inflation = send_v2.Inflation(threads=1, requests=2, waiting=1)
    loop = asyncio.get_running_loop()
    try:
        first = asyncio.create_task(inflation.run(lambda: release.wait(10)))
        queued = asyncio.create_task(inflation.run(lambda: "queued"))  # waits for the one thread
        await asyncio.sleep(0)
        with pytest.raises(errors.TooManyRequests, match="inflating 2 requests .* deadline came") as caught:
            await inflation.run(lambda: "late", deadline=loop.time() + REPLY_RESERVE_S + 0.05)
        assert code_of(caught.value) == v2.TOO_MANY_REQUESTS
        first.cancel()  # its client went away: the thread still inflates, its place stays taken
        with pytest.raises(asyncio.CancelledError):
            await first
        third = asyncio.create_task(inflation.run(lambda: "third"))
        await asyncio.sleep(0)
        with pytest.raises(errors.TooManyRequests, match="inflating 2 requests of GZIP bodies and 1 wait"):
            await inflation.run(lambda: "one waiter too many")
        third.cancel()  # a waiter whose client went away takes no place with it
        with pytest.raises(asyncio.CancelledError):
            await third
        fourth = asyncio.create_task(inflation.run(lambda: "fourth"))
        await asyncio.sleep(0)
        release.set()
        assert (await queued, await fourth) == ("queued", "fourth")
        assert await inflation.run(lambda: "again") == "again"
    finally:
        release.set()
        inflation.close()


async def test_sixteen_concurrent_gzip_requests_are_all_stored_while_at_most_four_inflate_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests past the bound wait their turn (FIFO, within their deadline) instead of being refused: ordinary
    GZIP traffic is stored whole, and the bound on inflating (memory, threads) holds meanwhile."""
    gate, lock, four, loop = threading.Event(), threading.Lock(), asyncio.Event(), asyncio.get_running_loop()
    inflating, most = [0], [0]
    real = send_v2.to_broker

    def held(*args: Any, **kwargs: Any) -> bpb.Message:  # a conversion that lasts until the gate opens
        with lock:
            inflating[0] += 1
            most[0] = max(most[0], inflating[0])
            if inflating[0] == 4:
                loop.call_soon_threadsafe(four.set)
        try:
            gate.wait(10)
            return real(*args, **kwargs)
        finally:
            with lock:
                inflating[0] -= 1

    monkeypatch.setattr(send_v2, "to_broker", held)
    broker = FakeBroker("b1")
    pool = BrokerPool({"b1": broker})
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0))
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    call = Call(proxy, settings, endpoints_for("127.0.0.1:1"), loop.time() + 10)
    inflation = send_v2.Inflation(threads=8, requests=4)  # threads to spare: only the bound holds them back
    requests = []
    for i in range(16):
        m = v2_message(1)
        m.body, m.system_properties.body_encoding = gzip.compress(b"%d" % i * 100), v2.GZIP
        requests.append(pb.SendMessageRequest(messages=[m]))
    try:
        sends = [asyncio.create_task(send_v2.send_message(call, r, inflation=inflation)) for r in requests]
        async with asyncio.timeout(5):
            await four.wait()
        await asyncio.sleep(0.05)  # a fifth would have started by now
        assert most[0] == 4 and not any(s.done() for s in sends)  # none refused: the other 12 wait
        gate.set()
        replies = await asyncio.gather(*sends)
    finally:
        gate.set()
        inflation.close()
    assert [r.status.code for r in replies] == [v2.OK] * 16
    assert sorted(m.body for m in broker.sent) == sorted(b"%d" % i * 100 for i in range(16))
    assert most[0] == 4


def inflation_held(monkeypatch: pytest.MonkeyPatch, *, max_send_bytes: int) -> tuple[threading.Event, Proxy, Call]:
    """A proxy with one broker and this send budget, whose GZIP conversions wait for the gate (an Event) to open."""
    gate = threading.Event()
    real = send_v2.to_broker

    def held(*args: Any, **kwargs: Any) -> bpb.Message:
        gate.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(send_v2, "to_broker", held)
    pool = BrokerPool({"b1": FakeBroker("b1")})
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), max_send_bytes=max_send_bytes)
    call = Call(proxy, Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),)), endpoints_for("127.0.0.1:1"), None)
    return gate, proxy, call


async def test_gzip_requests_waiting_to_inflate_count_against_max_send_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """40 GZIP requests of 256 KiB (compressed) against a 1 MiB send budget, their inflation held: those waiting for
    their turn hold their bytes in the budget, so past it the rest are TOO_MANY_REQUESTS at once rather than held
    outside any bound; once inflation goes on, those that waited are stored."""
    gate, proxy, call = inflation_held(monkeypatch, max_send_bytes=1 << 20)
    inflation = send_v2.Inflation()
    requests = []
    for i in range(40):
        message = v2_message(1)
        message.body, message.system_properties.body_encoding = (
            gzip.compress(bytes([i]) * 7 + os.urandom(256 << 10)),
            v2.GZIP,
        )
        requests.append(pb.SendMessageRequest(messages=[message]))
    try:
        sends = [asyncio.create_task(send_v2.send_message(call, r, inflation=inflation)) for r in requests]
        await asyncio.sleep(0.2)
        counted = proxy.sender.in_flight_bytes + proxy.sender.inflating_bytes
        gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 20)
    finally:
        gate.set()
        inflation.close()
    stored = [a for a in answers if isinstance(a, pb.SendMessageResponse) and a.status.code == v2.OK]
    refused = [a for a in answers if isinstance(a, errors.TooManyRequests)]
    assert len(stored) + len(refused) == 40 and refused and stored
    assert counted <= (1 << 20) + requests[0].ByteSize() + SEND_OVERHEAD  # one request alone always fits
    assert len(stored) * (256 << 10) <= (1 << 20) + (512 << 10)
    assert proxy.sender.in_flight_bytes == proxy.sender.inflating_bytes == 0


def gzipped_request(body: bytes) -> pb.SendMessageRequest:
    message = v2_message(1)
    message.body, message.system_properties.body_encoding = gzip.compress(body), v2.GZIP
    return pb.SendMessageRequest(messages=[message])


async def test_a_gzip_request_let_in_is_not_refused_after_inflating_for_those_behind_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GZIP request let in by the send budget inflates, then goes to its broker checked against the sends at
    brokers alone: the compressed bytes of the requests that came after it and wait to inflate do not refuse it."""
    gate, proxy, call = inflation_held(monkeypatch, max_send_bytes=1 << 20)
    inflation = send_v2.Inflation(requests=1)
    first = gzipped_request(b"\0" * (900 << 10))  # ~1 KiB sent, 900 KiB inflated: fits the budget alone
    behind = [gzipped_request(os.urandom(150 << 10)) for _ in range(3)]  # ~450 KiB sent, waiting for the place
    try:
        sends = [asyncio.create_task(send_v2.send_message(call, first, inflation=inflation))]
        await asyncio.sleep(0.05)
        sends += [asyncio.create_task(send_v2.send_message(call, r, inflation=inflation)) for r in behind]
        await asyncio.sleep(0.1)
        gate.set()
        answers = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), 20)
    finally:
        gate.set()
        inflation.close()
    assert isinstance(answers[0], pb.SendMessageResponse) and answers[0].status.code == v2.OK
