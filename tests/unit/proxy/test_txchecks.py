"""Transaction checks at the proxy (proxy.txchecks), no sockets: a check goes to one producer stream of its topic,
round robin, none when no producer of the topic is online or every one's outbox is full; the poller asks every
live broker for the topics its producers publish to."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings
from proxy.txchecks import (
    ANSWER_WAIT_S,
    FIRST_WINDOW,
    IDLE_FLOOR_S,
    OUTBOX_COMMANDS,
    TOPICS_PER_CALL,
    CheckPoller,
    Outbox,
    ProducerStreams,
)
from proxy.v2.telemetry import recover_command, telemetry


def test_checks_go_round_robin_to_the_topics_producers_and_nowhere_else() -> None:
    streams = ProducerStreams()
    a, b, other = Outbox(), Outbox(), Outbox()
    streams.register(a, ["t"])
    streams.register(b, ["t", "u"])
    streams.register(other, ["v"])
    assert streams.topics() == ["t", "u", "v"]
    for i in range(4):
        assert streams.deliver("t", f"tid{i}", lambda o, i=i: i)
    assert (a.commands.qsize(), b.commands.qsize(), other.commands.qsize()) == (2, 2, 0)
    assert not streams.deliver("nobody", "tid", lambda o: 0)
    streams.unregister(b)
    assert streams.topics() == ["t", "v"]
    for i in range(FIRST_WINDOW - 2):
        assert streams.deliver("t", f"more{i}", lambda o: 0)
    assert not streams.deliver("t", "last", lambda o: 0)  # full: the broker hands the check out again later


class FakeBroker:
    def __init__(self, name: str, checks: list[bpb.TransactionCheck], next_due_ms: int, now_ms: int = 0) -> None:
        self.name = name
        self.healthy = True
        self.asked: list[list[str]] = []
        self.answer = bpb.TransactionChecksResponse(checks=checks, next_due_ms=next_due_ms, now_ms=now_ms)

    async def transaction_checks(
        self, request: bpb.TransactionChecksRequest, *, timeout_s: float
    ) -> bpb.TransactionChecksResponse:
        self.asked.append(list(request.topics))
        return self.answer


async def test_the_poller_asks_every_live_broker_for_its_producers_topics() -> None:
    check = bpb.TransactionCheck(transaction_id="tid", check=1)
    check.message.message.topic = "t"
    b1, b2 = FakeBroker("b1", [check], 5000, now_ms=4500), FakeBroker("b2", [], 3000, now_ms=1000)
    b1.answer.check_interval_ms = 30_000  # b2 is older than the field: it tells none
    streams = ProducerStreams()
    outbox = Outbox()
    streams.register(outbox, ["t"])
    pool = BrokerPool({"b1": b1, "b2": b2})  # type: ignore[dict-item]
    poller = CheckPoller(pool, streams, lambda c, o: c.transaction_id, timeout_s=1)  # type: ignore[arg-type, return-value]
    assert await poller.poll_once(["t"]) == 0.5  # the earliest next check, each on its broker's clock
    assert b1.asked == [["t"]] and b2.asked == [["t"]]
    assert outbox.commands.get_nowait() == "tid" and poller.handed == 1
    assert streams.interval_s == 30  # the producers' windows are sized by it


async def test_the_next_check_is_awaited_on_the_brokers_clock_whatever_the_proxys_says() -> None:
    """A broker whose clock is an hour behind the proxy's, its next check 20 s away on its own clock: the poller
    waits for it (at most CHECK_POLL_S) instead of taking it for an hour overdue."""
    broker_now = int(time.time() * 1000) - 3_600_000
    streams = ProducerStreams()
    streams.register(Outbox(), ["t"])
    pool = BrokerPool({"b1": FakeBroker("b1", [], broker_now + 20_000, now_ms=broker_now)})  # type: ignore[dict-item]
    poller = CheckPoller(pool, streams, lambda c, o: None, timeout_s=1)
    assert await poller.poll_once(["t"]) == 20.0
    pool = BrokerPool({"b1": FakeBroker("b1", [], 0, now_ms=broker_now)})  # type: ignore[dict-item]
    assert await CheckPoller(pool, streams, lambda c, o: None, timeout_s=1).poll_once(["t"]) is None


async def test_a_producers_telemetry_stream_registers_its_topics_and_carries_its_checks() -> None:
    done = asyncio.Event()

    async def commands() -> AsyncIterator[pb.TelemetryCommand]:
        settings = v2.Settings(client_type=v2.PRODUCER)
        settings.publishing.topics.add(name="orders", resource_namespace="shop")
        yield pb.TelemetryCommand(settings=settings)
        await done.wait()  # the client keeps its stream open

    streams = ProducerStreams()
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    replies = telemetry(commands(), settings, asyncio.Event(), None, streams)  # type: ignore[arg-type]
    first = await anext(replies)
    assert first.status.code == v2.OK and streams.topics() == ["shop%orders"]
    check = bpb.TransactionCheck(transaction_id="tid", check=1)
    check.message.message.topic = "shop%orders"
    check.message.message.message_id = "m1"
    check.message.message.body = b"half"
    check.message.message.transactional = True
    assert streams.deliver("shop%orders", "tid", lambda outbox: recover_command(check, outbox))
    command = (await anext(replies)).recover_orphaned_transaction_command
    assert (command.transaction_id, command.message.system_properties.message_id) == ("tid", "m1")
    assert command.message.body == b"half" and command.message.system_properties.message_type == v2.TRANSACTION
    assert (command.message.topic.name, command.message.topic.resource_namespace) == ("orders", "shop")
    done.set()
    await replies.aclose()
    assert streams.topics() == []  # gone with its stream


class RecordingBroker(FakeBroker):
    """Answers as many due checks of topic "t" as it is asked for, and records how many that was."""

    def __init__(self, name: str = "b1") -> None:
        super().__init__(name, [], 0)
        self.max_checks: list[int] = []
        self.asked_only: list[list[str]] = []
        self.handed = 0

    async def transaction_checks(
        self, request: bpb.TransactionChecksRequest, *, timeout_s: float
    ) -> bpb.TransactionChecksResponse:
        self.asked.append(list(request.topics))
        self.max_checks.append(request.max_checks)
        self.asked_only.append(list(request.asked_topics))
        first, self.handed = self.handed, self.handed + request.max_checks
        checks = [bpb.TransactionCheck(transaction_id=f"{self.name}-{i}", check=1) for i in range(first, self.handed)]
        for check in checks:
            check.message.message.topic = "t"
        return bpb.TransactionChecksResponse(checks=checks)


async def test_the_poller_asks_for_no_more_checks_than_its_producers_outboxes_take() -> None:
    streams = ProducerStreams()
    outbox = Outbox()
    streams.register(outbox, ["t"])
    for i in range(FIRST_WINDOW - 3):
        assert streams.deliver("t", f"earlier{i}", lambda o: "earlier")
    broker = RecordingBroker()
    pool = BrokerPool({"b1": broker})  # type: ignore[dict-item]
    poller = CheckPoller(pool, streams, lambda c, o: c.transaction_id, timeout_s=1)  # type: ignore[arg-type, return-value]
    await poller.poll_once(["t"])
    assert broker.max_checks == [3] and poller.handed == 3  # every check the broker recorded reached a producer
    await poller.poll_once(["t"])
    assert broker.max_checks == [3, 0] and broker.asked_only[-1] == ["t"]  # no room: no check (it would burn
    # unseen), but the topic is still asked for (its half messages wait)


async def test_every_broker_is_told_of_the_topics_asked_for_when_the_first_takes_the_room() -> None:
    """Two brokers with checks due and a producer with room for one broker's worth: the broker asked first takes
    the room and the other is told the topic is asked for (so it rolls back none unchecked); the next round starts
    at the other broker, so both hand out checks in turn."""
    streams = ProducerStreams()
    outbox = Outbox()
    streams.register(outbox, ["t"])
    b1, b2 = RecordingBroker("b1"), RecordingBroker("b2")
    poller = CheckPoller(BrokerPool({"b1": b1, "b2": b2}), streams, lambda c, o: c.transaction_id, timeout_s=1)  # type: ignore[dict-item, arg-type, return-value]
    handed: list[str] = []
    for _ in range(4):
        await poller.poll_once(["t"])
        while not outbox.commands.empty():
            handed.append(tid := outbox.commands.get_nowait())
            streams.answered("t", tid)
    assert {tid.split("-")[0] for tid in handed} == {"b1", "b2"}
    for broker in (b1, b2):
        assert all(
            topics == ["t"] or only == ["t"] for topics, only in zip(broker.asked, broker.asked_only, strict=True)
        )
        assert len(broker.asked) == 4  # every round, with room or not


async def test_a_producer_answering_slower_than_checks_come_is_handed_no_more_than_it_has_room_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its stream takes every command at once (gRPC buffers them) but the producer answers few: a check counts until
    its EndTransaction comes (or ANSWER_WAIT_S passed), so the broker is asked for no more checks than the producer
    has room for, and none it counts as asked waits unseen behind the others until its half message rolls back."""
    streams = ProducerStreams()
    outbox = Outbox()
    streams.register(outbox, ["t"])
    broker = RecordingBroker()
    poller = CheckPoller(BrokerPool({"b1": broker}), streams, lambda c, o: c.transaction_id, timeout_s=1)  # type: ignore[dict-item]
    sent: list[str] = []

    async def poll() -> None:
        await poller.poll_once(["t"])
        while not outbox.commands.empty():  # the stream writes them out
            sent.append(outbox.commands.get_nowait())

    for _ in range(5):
        await poll()
    assert poller.handed == broker.handed == len(sent) == FIRST_WINDOW  # a new producer: its first window
    for tid in sent[:3]:
        streams.answered("t", tid)  # at once: each answer widens the window by one
    assert outbox.window == FIRST_WINDOW + 3
    await poll()
    assert broker.max_checks[-1] == 6 and poller.handed == FIRST_WINDOW + 6
    streams.changed.clear()
    for tid in sent[3:6]:
        assert not streams.changed.is_set()
        streams.answered("t", tid)
    assert len(outbox.unanswered) == 4 <= outbox.window // 2 and streams.changed.is_set()  # half: asked at once
    later = time.monotonic() + ANSWER_WAIT_S  # unanswered (UNKNOWN sends nothing) checks stop counting then
    monkeypatch.setattr("proxy.txchecks.time", SimpleNamespace(monotonic=lambda: later, time=time.time))
    assert outbox.room() == outbox.window


def answer_times(
    seconds_per_answer: float, interval_s: float, run_s: float, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[float], Outbox]:
    """A producer answering its checks in turn, one each `seconds_per_answer`, with checks always due and handed
    out whenever the proxy would ask (woken by `answered`, or each CHECK_POLL_S): how long each answer took, and
    the producer's outbox at the end."""
    clock = [0.0]
    monkeypatch.setattr("proxy.txchecks.time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    streams = ProducerStreams()
    outbox = Outbox()
    streams.register(outbox, ["t"])
    streams.interval_s = interval_s
    handed: deque[tuple[str, float]] = deque()
    took: list[float] = []
    next_poll = 0.0
    while clock[0] < run_s:
        if streams.changed.is_set() or clock[0] >= next_poll:
            streams.changed.clear()
            next_poll = clock[0] + 1.0
            for _ in range(outbox.room()):
                tid = f"tid{len(took) + len(handed)}"
                assert streams.deliver("t", tid, lambda o: None)
                outbox.commands.get_nowait()  # the stream writes it out at once
                handed.append((tid, clock[0]))
        clock[0] += seconds_per_answer
        if handed:
            tid, at = handed.popleft()
            took.append(clock[0] - at)
            streams.answered("t", tid)
    return took, outbox


def test_a_slow_checker_gets_no_more_checks_than_it_answers_within_half_an_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A producer answering 50 checks a second, the brokers checking each transaction 1 s apart: after its first
    window every check it gets is answered within the interval, a last check before its transaction would roll back
    (with the window at OUTBOX_COMMANDS from the start, checks waited past it); and it is kept busy. So are producers
    answering 5 and 2 a second, each check soon answered at once. A producer answering at once gets
    OUTBOX_COMMANDS."""
    took, _ = answer_times(0.02, 1.0, 20.0, monkeypatch)
    assert max(took[FIRST_WINDOW:]) < 1.0
    assert len(took) >= 0.95 * 20 / 0.02
    for seconds_per_answer in (0.2, 0.5):  # 5 and 2 a second: after the first window, each at once in time
        took, _ = answer_times(seconds_per_answer, 1.0, 30.0, monkeypatch)
        assert max(took[FIRST_WINDOW:]) <= 1.0 and max(took[3 * FIRST_WINDOW :]) <= 0.5
        assert len(took) >= 0.9 * 30 / seconds_per_answer
    _, fast = answer_times(0.0001, 1.0, 0.1, monkeypatch)
    assert fast.window == OUTBOX_COMMANDS


def test_a_check_skipped_frees_its_place_when_a_later_one_is_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer whose client sends nothing for UNKNOWN (the official Node.js and Java clients) answers the checks
    handed after one it left: that one no longer holds a place (it would for ANSWER_WAIT_S, in which the other
    transactions' checks would wait); one only slow to come holds its place until it is answered or ANSWER_WAIT_S
    passed, and its late answer still tells the window the producer is slow."""
    clock = [100.0]
    monkeypatch.setattr("proxy.txchecks.time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))
    streams = ProducerStreams()
    outbox = Outbox()
    streams.register(outbox, ["t"])
    streams.interval_s = 1.0
    for i in range(FIRST_WINDOW):
        assert streams.deliver("t", f"tid{i}", lambda o: None)
        outbox.commands.get_nowait()
        clock[0] += 0.001
    clock[0] += 0.1
    streams.answered("t", "tid2")  # tid0 and tid1 were skipped (UNKNOWN): their places are free
    assert list(outbox.unanswered) == [f"tid{i}" for i in range(3, FIRST_WINDOW)]
    assert streams.room("t") == outbox.window - (FIRST_WINDOW - 3)
    clock[0] += ANSWER_WAIT_S - 1  # tid3... are only slow: they hold their places
    assert len(outbox.unanswered) == FIRST_WINDOW - 3 and streams.room("t") == outbox.window - (FIRST_WINDOW - 3)
    clock[0] += 1
    assert streams.room("t") == outbox.window  # ANSWER_WAIT_S passed
    streams.answered("t", "tid3")  # 4 answered in 10 s: 1 is what it answers in half an interval
    assert outbox.window == 1


async def test_closing_the_poller_ends_its_task_before_it_returns() -> None:
    streams = ProducerStreams()
    streams.register(Outbox(), ["t"])
    pool = BrokerPool({"b1": FakeBroker("b1", [], 0)})  # type: ignore[dict-item]
    poller = CheckPoller(pool, streams, lambda c, o: None, timeout_s=1)
    poller.start()
    task = poller._task
    await asyncio.sleep(0)  # it runs: a round, then its wait
    await poller.close()
    assert task is not None and task.done()


async def test_a_due_check_not_handed_out_is_asked_for_a_moment_later() -> None:
    """A broker whose only due check is not handed out (its transaction being ended, or another proxy's check of it
    being recorded) answers no check and a next due time already past: the poller asks again after a floor, not at
    once (it made ~49,000 calls a second)."""
    broker = FakeBroker("b1", [], int(time.time() * 1000) - 5)
    streams = ProducerStreams()
    streams.register(Outbox(), ["t"])
    poller = CheckPoller(BrokerPool({"b1": broker}), streams, lambda c, o: None, timeout_s=1)  # type: ignore[arg-type, dict-item]
    poller.start()
    await asyncio.sleep(0.5)
    await poller.close()
    assert 1 <= len(broker.asked) <= 0.5 / IDLE_FLOOR_S + 1


async def test_a_telemetry_command_that_does_not_decode_is_a_bad_request_not_an_internal_error() -> None:
    """The client's bytes do not parse (grpc's request iterator raises DecodeError): its stream gets BAD_REQUEST and
    ends, instead of an internal error and a traceback in the proxy's log."""

    async def commands() -> AsyncIterator[pb.TelemetryCommand]:
        yield pb.TelemetryCommand.FromString(b"\x12\xff\xff")  # as the server's deserializer meets the bytes

    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    replies = [r async for r in telemetry(commands(), settings, asyncio.Event(), None, ProducerStreams())]  # type: ignore[arg-type]
    assert [(r.status.code, r.status.message) for r in replies] == [
        (v2.BAD_REQUEST, "a TelemetryCommand that does not decode")
    ]


class BrokenBroker(FakeBroker):
    """Its answers break the poller (a bug, or an answer the broker client let through)."""

    async def transaction_checks(
        self, request: bpb.TransactionChecksRequest, *, timeout_s: float
    ) -> bpb.TransactionChecksResponse:
        self.asked.append(list(request.topics))
        raise AttributeError("'NoneType' object has no attribute 'checks'")


async def test_one_brokers_failure_does_not_keep_the_poller_from_asking_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A crashed producer's transactions on a healthy broker are still checked; the failing broker is logged once a
    round, without a traceback."""
    check = bpb.TransactionCheck(transaction_id="tid", check=1)
    check.message.message.topic = "t"
    b1, b2 = BrokenBroker("b1", [], 0), FakeBroker("b2", [check], 0)
    streams = ProducerStreams()
    outbox = Outbox()
    streams.register(outbox, [f"t{i}" for i in range(TOPICS_PER_CALL)] + ["t"])  # two calls to each broker a round
    pool = BrokerPool({"b1": b1, "b2": b2})  # type: ignore[dict-item]
    poller = CheckPoller(pool, streams, lambda c, o: c.transaction_id, timeout_s=1)  # type: ignore[arg-type, return-value]
    assert await poller.poll_once(streams.topics()) is None
    assert outbox.commands.get_nowait() == "tid" and len(b2.asked) == 2
    assert len(b1.asked) == 1  # its round ended at its first failure
    logged = [r for r in caplog.records if r.name == "proxy.txchecks"]
    assert len(logged) == 1 and "b1" in logged[0].getMessage() and logged[0].exc_info is None
