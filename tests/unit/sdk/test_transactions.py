"""The SDK's transactions (popgate.transactions), no sockets: a commit or rollback tries every half message and
names each one that failed; a failing rollback does not hide the exception that caused it; a check stream
survives a check it cannot read or an unexpected failure of its stream."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Message, Producer, SendReceipt, aio, errors
from popgate import transactions as tx_module
from popgate.transactions import AsyncCheckStream, AsyncTransaction, CheckStream, Transaction
from tests.unit.sdk.fakes import FakeRpcError, SessionCall, SessionChannel


class FakeProducer:
    """What a transaction and a check stream use of a producer; `failing`: message ids whose resolution fails."""

    def __init__(self, failing: dict[str, errors.PopgateError] | None = None) -> None:
        self.failing = failing or {}
        self.ended: list[tuple[str, bool | None]] = []
        self._open_halves: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self.options = type("Options", (), {"namespace": ""})()
        self._stub: Any = None

    def _metadata(self) -> list[tuple[str, str]]:
        return []

    def _end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool | None, *, from_check: bool
    ) -> None:
        if message_id in self.failing:
            raise self.failing[message_id]
        self.ended.append((message_id, commit))


class AsyncFakeProducer(FakeProducer):
    async def _end_transaction(  # type: ignore[override]
        self, topic: str, message_id: str, transaction_id: str, commit: bool | None, *, from_check: bool
    ) -> None:
        super()._end_transaction(topic, message_id, transaction_id, commit, from_check=from_check)


def halves(tx: Transaction | AsyncTransaction, ids: list[str]) -> None:
    for message_id in ids:
        tx._sent("t", SendReceipt(message_id, "t", -1, transaction_id=f"tid-{message_id}"))


def test_a_commit_tries_every_half_message_and_names_each_that_failed() -> None:
    producer = FakeProducer({"m1": errors.Unavailable("proxy gone"), "m3": errors.ServerError("disk full")})
    tx = Transaction(producer)  # type: ignore[arg-type]
    halves(tx, ["m1", "m2", "m3", "m4"])
    with pytest.raises(errors.TransactionError) as caught:
        tx.commit()
    assert producer.ended == [("m2", True), ("m4", True)]  # the others were still committed
    assert [(m, type(e)) for m, e in caught.value.failures] == [("m1", errors.Unavailable), ("m3", errors.ServerError)]
    assert "m1" in str(caught.value) and "m3" in str(caught.value) and "disk full" in str(caught.value)
    assert not caught.value.retriable  # the transaction is over: what failed is left to the checker


def test_a_failing_rollback_does_not_hide_the_exception_that_caused_it(caplog: pytest.LogCaptureFixture) -> None:
    producer = FakeProducer({"m1": errors.Unavailable("proxy gone")})
    with pytest.raises(KeyError) as caught, caplog.at_level(logging.WARNING, "popgate.transactions"):
        with Transaction(producer) as tx:  # type: ignore[arg-type]
            halves(tx, ["m1", "m2"])
            raise KeyError("the order could not be saved")
    assert producer.ended == [("m2", False)]
    assert any("m1" in note for note in caught.value.__notes__)  # the rollback's failure rides along
    assert "rolling back" in caplog.text


async def test_the_asyncio_transaction_does_the_same() -> None:
    producer = AsyncFakeProducer({"m1": errors.Unavailable("proxy gone")})
    tx = AsyncTransaction(producer)  # type: ignore[arg-type]
    halves(tx, ["m1", "m2"])
    with pytest.raises(errors.TransactionError) as failed:
        await tx.commit()
    assert producer.ended == [("m2", True)] and [m for m, _ in failed.value.failures] == ["m1"]
    with pytest.raises(KeyError) as caught:
        async with AsyncTransaction(producer) as tx:  # type: ignore[arg-type]
            halves(tx, ["m1", "m3"])
            raise KeyError("the order could not be saved")
    assert producer.ended[-1] == ("m3", False) and caught.value.__notes__


def check_command(message_id: str) -> pb.TelemetryCommand:
    command = pb.TelemetryCommand()
    recover = command.recover_orphaned_transaction_command
    recover.transaction_id = f"tid-{message_id}"
    recover.message.topic.name = "t"
    recover.message.system_properties.message_id = message_id
    recover.message.body = b"half"
    return command


def unreadable_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """`checks_of` fails on the command for message "bad", as on a message the SDK cannot read."""
    real = tx_module.checks_of

    def checks_of(command: pb.TelemetryCommand) -> tuple[Message, str] | None:
        if command.recover_orphaned_transaction_command.message.system_properties.message_id == "bad":
            raise ValueError("unreadable message")
        return real(command)

    monkeypatch.setattr(tx_module, "checks_of", checks_of)


def test_a_check_stream_goes_on_after_a_check_it_cannot_read_or_a_failing_stream(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unreadable_first(monkeypatch)
    monkeypatch.setattr(tx_module, "RECONNECT_S", 0.01)
    producer = FakeProducer()
    answered = threading.Event()
    opened: list[int] = []

    class Call:
        def __init__(self, commands: list[pb.TelemetryCommand]) -> None:
            self._commands = commands

        def __iter__(self) -> Iterator[pb.TelemetryCommand]:
            yield from self._commands
            answered.wait(5)  # the stream stays open until the test is done

        def cancel(self) -> None:
            answered.set()

    def telemetry(requests: Any, metadata: Any) -> Call:
        opened.append(1)
        if len(opened) == 1:
            raise RuntimeError("unexpected")  # not a gRPC error: the stream is opened again all the same
        return Call([check_command("bad"), check_command("good")])

    producer._stub = type("Stub", (), {"Telemetry": staticmethod(telemetry)})()
    original = producer._end_transaction

    def end(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        answered.set()

    producer._end_transaction = end  # type: ignore[method-assign]
    stream = CheckStream(producer, lambda m: True, ["t"])  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "popgate.transactions"):
        stream.start()
        assert answered.wait(5)
        stream.close()
    assert producer.ended == [("good", True)]
    assert "unexpected" in caplog.text and "unreadable message" in caplog.text


async def test_an_asyncio_check_stream_goes_on_after_a_check_it_cannot_read_or_a_failing_stream(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    unreadable_first(monkeypatch)
    monkeypatch.setattr(tx_module, "RECONNECT_S", 0.01)
    producer = AsyncFakeProducer()
    opened: list[int] = []

    async def commands() -> AsyncIterator[pb.TelemetryCommand]:
        for command in (check_command("bad"), check_command("good")):
            yield command
        await asyncio.Event().wait()  # the stream stays open

    def telemetry(requests: Any, metadata: Any) -> AsyncIterator[pb.TelemetryCommand]:
        opened.append(1)
        if len(opened) == 1:
            raise RuntimeError("unexpected")
        return commands()

    producer._stub = type("Stub", (), {"Telemetry": staticmethod(telemetry)})()
    stream = AsyncCheckStream(producer, lambda m: True, ["t"])  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, "popgate.transactions"):
        stream.start()
        async with asyncio.timeout(5):
            while not producer.ended:  # noqa: ASYNC110  # the stream has no event for "answered"
                await asyncio.sleep(0.01)
        await stream.close()
    assert producer.ended == [("good", True)]
    assert "unexpected" in caplog.text and "unreadable message" in caplog.text


def asking(asked: list[str]) -> Callable[[Message], bool]:
    """A checker that commits everything, noting what it was asked about."""

    def checker(message: Message) -> bool:
        asked.append(message.message_id)
        return True

    return checker


def test_a_check_of_the_producers_own_open_transaction_is_answered_unknown_without_the_checker() -> None:
    producer = FakeProducer()
    asked: list[str] = []
    stream = CheckStream(producer, asking(asked), ["t"])  # type: ignore[arg-type]
    tx = Transaction(producer)  # type: ignore[arg-type]
    halves(tx, ["open"])
    stream._answer(Message(b"half", topic="t", message_id="open"), "tid-open")
    stream._answer(Message(b"half", topic="t", message_id="orphan"), "tid-orphan")  # not this producer's
    assert asked == ["orphan"] and producer.ended == [("open", None), ("orphan", True)]
    tx.rollback()  # ended: a later check of it is the checker's again
    stream._answer(Message(b"half", topic="t", message_id="open"), "tid-open")
    assert asked == ["orphan", "open"]


def test_a_transaction_dropped_without_its_end_is_the_checkers_again() -> None:
    """A transaction the application drops without ending it (an error between its send and its commit) goes
    back to the checker: its checks are no longer answered "unknown" for good, which would roll it back."""
    producer = FakeProducer()
    asked: list[str] = []
    stream = CheckStream(producer, asking(asked), ["t"])  # type: ignore[arg-type]
    tx = Transaction(producer)  # type: ignore[arg-type]
    halves(tx, ["dropped"])
    del tx
    gc.collect()
    stream._answer(Message(b"half", topic="t", message_id="dropped"), "tid-dropped")
    assert asked == ["dropped"] and len(producer._open_halves) == 0


async def test_an_asyncio_check_of_the_producers_own_open_transaction_is_answered_unknown() -> None:
    producer = AsyncFakeProducer()
    asked: list[str] = []
    stream = AsyncCheckStream(producer, asking(asked), ["t"])  # type: ignore[arg-type]
    async with AsyncTransaction(producer) as tx:  # type: ignore[arg-type]
        halves(tx, ["open"])
        await stream._answer(Message(b"half", topic="t", message_id="open"), "tid-open")
    assert asked == [] and producer.ended == [("open", None), ("open", True)]


def test_a_broken_check_stream_leaves_no_thread_reading_its_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC reads a stream's requests on a thread of its own until they end: a stream that broke (a proxy's
    connection age, a restart) must end them, or each break leaves a thread behind until the producer closes."""
    monkeypatch.setattr(tx_module, "RECONNECT_S", 0.01)
    readers: list[threading.Thread] = []
    third_open = threading.Event()

    class Call:
        def __init__(self, breaks: bool) -> None:
            self._breaks = breaks
            self._cancelled = threading.Event()

        def __iter__(self) -> Iterator[pb.TelemetryCommand]:
            if self._breaks:
                raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)
            self._cancelled.wait(30)
            yield from ()

        def cancel(self) -> None:
            self._cancelled.set()

    def telemetry(requests: Iterator[pb.TelemetryCommand], metadata: Any) -> Call:
        reader = threading.Thread(target=lambda: list(requests), daemon=True)  # as gRPC reads a request stream
        reader.start()
        readers.append(reader)
        if len(readers) == 3:
            third_open.set()
        return Call(breaks=len(readers) < 3)

    producer = FakeProducer()
    producer._stub = type("Stub", (), {"Telemetry": staticmethod(telemetry)})()
    stream = CheckStream(producer, lambda m: None, ["t"])  # type: ignore[arg-type]
    stream.start()
    try:
        assert third_open.wait(5)
        for reader in readers[:2]:
            reader.join(5)
        assert [reader.is_alive() for reader in readers[:3]] == [False, False, True]  # the open one still reads
    finally:
        stream.close()
    readers[2].join(5)
    assert not readers[2].is_alive()


async def test_a_broken_asyncio_check_stream_ends_its_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tx_module, "RECONNECT_S", 0.01)
    readers: list[asyncio.Task[Any]] = []

    async def broken() -> AsyncIterator[pb.TelemetryCommand]:
        raise FakeRpcError(grpc.StatusCode.UNAVAILABLE)
        yield  # pragma: no cover

    async def read(requests: AsyncIterator[pb.TelemetryCommand]) -> None:
        async for _ in requests:
            pass

    def telemetry(requests: AsyncIterator[pb.TelemetryCommand], metadata: Any) -> AsyncIterator[pb.TelemetryCommand]:
        readers.append(asyncio.ensure_future(read(requests)))  # as grpc.aio reads a request stream
        return broken()

    producer = AsyncFakeProducer()
    producer._stub = type("Stub", (), {"Telemetry": staticmethod(telemetry)})()
    stream = AsyncCheckStream(producer, lambda m: None, ["t"])  # type: ignore[arg-type]
    stream.start()
    try:
        async with asyncio.timeout(5):
            while len(readers) < 3:  # noqa: ASYNC110  # the fake has no event for "opened again"
                await asyncio.sleep(0.01)
            await asyncio.gather(*readers[:2])  # the broken streams' requests ended
    finally:
        await stream.close()
    for reader in readers:
        reader.cancel()


class OlderProxyCall(SessionCall):
    """A Session stream of a proxy older than EndTransaction on it: a request of a kind it does not know is
    answered as one without a body, a bare BAD_REQUEST status (proxy/v2/session.py before it knew the kind)."""

    async def write(self, message: bytes) -> None:
        await super().write(message)
        request = ext.SessionRequest.FromString(message)
        for one in (request, *request.more):
            status = v2.Status(code=v2.BAD_REQUEST, message="session: a request without a body")
            self.answers.put_nowait(ext.SessionResponse(id=one.id, status=status))


async def test_an_asyncio_producer_ends_transactions_by_call_once_its_proxy_does_not_take_them_on_the_stream() -> None:
    """A proxy whose Session is older than EndTransaction on it: that end, and every later one, is the
    EndTransaction call, not a BAD_REQUEST to the caller."""
    called: list[pb.EndTransactionRequest] = []

    async def end_transaction(request: pb.EndTransactionRequest, **_: Any) -> pb.EndTransactionResponse:
        called.append(request)
        return pb.EndTransactionResponse(status=v2.Status(code=v2.OK))

    call = OlderProxyCall()
    producer = aio.Producer("127.0.0.1:1")
    producer._channel = SessionChannel(call)  # type: ignore[assignment]
    producer._stub_ = type("Stub", (), {"EndTransaction": staticmethod(end_transaction)})()
    await producer._end_transaction("t", "m1", "tid-1", True, from_check=False)
    await producer._end_transaction("t", "m2", "tid-2", False, from_check=False)
    await producer.close()
    assert len(call.written) == 1 and producer._ends_served is False  # asked once on the stream
    assert [(r.message_id, r.resolution) for r in called] == [("m1", v2.COMMIT), ("m2", v2.ROLLBACK)]


def failing(message: Message) -> bool:
    raise ConnectionError("the orders database is down")


async def test_a_checker_that_raises_answers_unknown_so_the_next_check_comes_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A checker failing (its database down) answers "unknown", blocking and asyncio alike: the transaction is
    checked again at its next interval, and the proxy, which holds a producer's place for each check until it is
    answered, hands the next check at once instead of after half the interval (official clients send their answer
    likewise); the failure is logged."""
    producer = FakeProducer()
    CheckStream(producer, failing, ["t"])._answer(Message(b"half", topic="t", message_id="m1"), "tid-1")  # type: ignore[arg-type]
    aio_producer = AsyncFakeProducer()
    await AsyncCheckStream(aio_producer, failing, ["t"])._answer(Message(b"half", topic="t", message_id="m2"), "tid-2")  # type: ignore[arg-type]
    assert producer.ended == [("m1", None)] and aio_producer.ended == [("m2", None)]
    assert [r.getMessage().split(";")[0] for r in caplog.records] == [
        f"the checker failed on message {m}" for m in ("m1", "m2")
    ]


def test_a_check_answered_while_close_waits_for_the_check_thread_is_sent(caplog: pytest.LogCaptureFixture) -> None:
    """The checker decides as close() begins: close() waits for the check thread (at most 5 s) before the channel
    closes, and the answer goes, with nothing logged."""
    producer = Producer("127.0.0.1:1")
    ended: list[pb.EndTransactionRequest] = []
    closing, done = threading.Event(), threading.Event()

    class Call:
        def __iter__(self) -> Iterator[pb.TelemetryCommand]:
            yield check_command("m1")
            done.wait(10)

        def cancel(self) -> None:
            done.set()

    def end_transaction(request: pb.EndTransactionRequest, **_: Any) -> pb.EndTransactionResponse:
        ended.append(request)
        return pb.EndTransactionResponse(status=v2.Status(code=v2.OK))

    class Stub:
        Telemetry = staticmethod(lambda requests, metadata: Call())
        EndTransaction = staticmethod(end_transaction)

    producer._stub = Stub()

    def checker(message: Message) -> bool:
        assert closing.wait(10)
        return True

    producer._checks = CheckStream(producer, checker, ["t"])
    closing_ = producer._closing

    def noted() -> None:
        closing.set()
        closing_()

    producer._closing = noted  # type: ignore[method-assign]
    producer._checks.start()
    with caplog.at_level(logging.WARNING, "popgate.transactions"):
        producer.close()
    assert len(ended) == 1 and not caplog.records
