"""Transactions and their checker, for `Producer.transaction` (blocking) and `popgate.aio.Producer.transaction`.

A transaction's messages are stored as half messages no consumer sees until the transaction commits; a rollback
discards them. Leaving a ``with`` block commits, leaving it with an exception rolls back. A transaction still
unresolved after the broker's immunity (its producer died, or its local work is slow) is left to the **checker**:
the broker asks a producer of the same topic (any instance, through any proxy) whether to commit, and after 15
unanswered checks rolls back. The checker answers from the local transaction's own record; a producer answers
"unknown" for its own transactions not ended yet without asking it.

    >>> def checker(message: Message) -> bool | None:  # doctest: +SKIP
    ...     return orders.outcome(message.keys[0])  # True: committed, False: failed, None: no outcome yet
    >>> with Producer(endpoint, checker=checker, topics=["orders"]) as producer:  # doctest: +SKIP
    ...     with producer.transaction() as tx:
    ...         tx.send("orders", b"created", keys=["o-1"])
    ...         orders.insert("o-1")  # an exception here rolls the message back
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import grpc
from popgate_pb.v2 import service_pb2 as pb

from . import _wire, errors
from .message import Message, SendReceipt

if TYPE_CHECKING:
    from .aio import Producer as AsyncProducer
    from .client import Producer

log = logging.getLogger(__name__)

Checker = Callable[[Message], "bool | None | Awaitable[bool | None]"]
"""Asked about a half message left unresolved: True commits, False rolls back, None (or an exception) leaves it
to a later check. It answers from the local transaction's record: the transaction may still be under way in another
instance. The asyncio producer also takes a coroutine function."""

RECONNECT_S = 1.0  # a check stream that broke is opened again after this long
Half = tuple[str, str, str]  # topic, message id, transaction id


class _Halves:
    """What a transaction sent, and whether it ended (shared by the blocking and the asyncio transaction).

    Until its commit or rollback is over, the message ids of its halves are in the producer's ``_open_halves``:
    a check of one is answered "unknown" without asking the checker (`_own_open`). Held there weakly: a transaction
    the application dropped without ending it goes back to the checker —
    tests/unit/sdk/test_transactions.py::test_a_transaction_dropped_without_its_end_is_the_checkers_again."""

    def __init__(self, open_halves: weakref.WeakValueDictionary[str, _Halves]) -> None:
        self._halves: list[Half] = []
        self._ended = False
        self._open_halves = open_halves

    def _check_open(self) -> None:
        if self._ended:
            raise RuntimeError("the transaction is committed or rolled back already")

    def _sent(self, topic: str, receipt: SendReceipt) -> SendReceipt:
        self._halves.append((topic, receipt.message_id, receipt.transaction_id))
        self._open_halves[receipt.message_id] = self
        return receipt

    def _finish(self) -> list[Half]:
        self._check_open()
        self._ended = True
        return self._halves

    def _forget(self) -> None:
        """The commit or rollback is over (what failed of it is the checker's now)."""
        for _, message_id, _ in self._halves:
            if self._open_halves.get(message_id) is self:
                del self._open_halves[message_id]


def _own_open(producer: Producer | AsyncProducer, message: Message) -> bool:
    """Whether a check asks about a half of this producer's own transaction still under way: the answer is
    "unknown" (asked again later), as RocketMQ's producers answer for a local transaction in progress, never the
    checker's, which cannot know the block's outcome — tests/unit/sdk/test_transactions.py::
    test_a_check_of_the_producers_own_open_transaction_is_answered_unknown_without_the_checker."""
    return message.message_id in producer._open_halves


def _raise_failures(failures: list[tuple[str, errors.PopgateError]], commit: bool) -> None:
    """Every half message was tried: one error naming each that failed, if any did."""
    if failures:
        raise errors.TransactionError(failures, commit=commit)


def _rollback_failed(exc: BaseException, rollback: Exception) -> None:
    """The block raised `exc` and rolling back failed too: `exc` goes on (it is the cause), carrying a note of
    the rollback's failure, which is also logged."""
    log.warning("rolling back a transaction after %s failed: %s", type(exc).__name__, rollback)
    exc.add_note(f"rolling the transaction back failed too: {rollback}")


class Transaction(_Halves):
    """Half messages sent together, committed or rolled back together (`Producer.transaction`).

    Use as a context manager: it commits when the block ends normally and rolls back when it raises. A commit or
    rollback tries every half message and raises `popgate.errors.TransactionError` naming each that failed; those
    are left to the checker. A rollback that fails as the block raises does not replace the block's exception: it
    is added to it as a note, and logged.
    """

    def __init__(self, producer: Producer) -> None:
        super().__init__(producer._open_halves)
        self._producer = producer

    def send(
        self,
        topic: str,
        body: bytes | str | Message,
        *,
        tag: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> SendReceipt:
        """Send a half message of this transaction (no message group, delay or priority).

        Returns:
            Its receipt, with the ``transaction_id``.
        """
        self._check_open()
        return self._sent(topic, self._producer._send_half(topic, body, tag=tag, keys=keys, properties=properties))

    def commit(self) -> None:
        """Make the transaction's messages visible to consumers (each once)."""
        self._end(True)

    def rollback(self) -> None:
        """Discard the transaction's messages."""
        self._end(False)

    def _end(self, commit: bool) -> None:
        failures: list[tuple[str, errors.PopgateError]] = []
        try:
            for topic, message_id, transaction_id in self._finish():
                try:
                    self._producer._end_transaction(topic, message_id, transaction_id, commit, from_check=False)
                except errors.PopgateError as failed:
                    failures.append((message_id, failed))
        finally:
            self._forget()
        _raise_failures(failures, commit)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._ended:
            return
        if exc is None:
            self._end(True)
            return
        try:
            self._end(False)
        except Exception as rollback:
            _rollback_failed(exc, rollback)


class AsyncTransaction(_Halves):
    """The asyncio twin of `Transaction` (`popgate.aio.Producer.transaction`)."""

    def __init__(self, producer: AsyncProducer) -> None:
        super().__init__(producer._open_halves)
        self._producer = producer

    async def send(
        self,
        topic: str,
        body: bytes | str | Message,
        *,
        tag: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> SendReceipt:
        """Send a half message of this transaction; see `Transaction.send`."""
        self._check_open()
        return self._sent(
            topic, await self._producer._send_half(topic, body, tag=tag, keys=keys, properties=properties)
        )

    async def commit(self) -> None:
        await self._end(True)

    async def rollback(self) -> None:
        await self._end(False)

    async def _end(self, commit: bool) -> None:
        failures: list[tuple[str, errors.PopgateError]] = []
        try:
            for topic, message_id, transaction_id in self._finish():
                try:
                    await self._producer._end_transaction(topic, message_id, transaction_id, commit, from_check=False)
                except errors.PopgateError as failed:
                    failures.append((message_id, failed))
        finally:
            self._forget()
        _raise_failures(failures, commit)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._ended:
            return
        if exc is None:
            await self._end(True)
            return
        try:
            await self._end(False)
        except Exception as rollback:
            _rollback_failed(exc, rollback)


def checks_of(command: pb.TelemetryCommand) -> tuple[Message, str] | None:
    """The half message and transaction id a Telemetry command asks about, if it is a check."""
    if not command.HasField("recover_orphaned_transaction_command"):
        return None
    recover = command.recover_orphaned_transaction_command
    return _wire.from_v2(recover.message), recover.transaction_id


def _readable_check(command: pb.TelemetryCommand) -> tuple[Message, str] | None:
    """`checks_of`, None for a check that cannot be read (logged): it is asked again at its next check, and the
    stream goes on with the next command."""
    try:
        return checks_of(command)
    except Exception:
        log.exception("a transaction check from the server could not be read; it is checked again later")
        return None


class CheckStream:
    """A blocking producer's Telemetry stream on a thread of its own: it tells the proxy the topics, answers each
    check with the checker's resolution, and opens again after a break until closed."""

    def __init__(self, producer: Producer, checker: Checker, topics: Sequence[str]) -> None:
        self._producer = producer
        self._checker = checker
        self._settings = _wire.producer_settings(topics, namespace=producer.options.namespace)
        self._stop = threading.Event()
        self._call: Any = None
        self._thread = threading.Thread(target=self._run, name="popgate-transaction-checks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _requests(self, ended: threading.Event) -> Any:
        yield self._settings
        ended.wait()  # the stream stays open until it ends: gRPC's thread reading it ends with it

    def _run(self) -> None:
        while not self._stop.is_set():
            # This stream's own: gRPC's thread reading its requests ends with it, not with the producer —
            # tests/unit/sdk/test_transactions.py::test_a_broken_check_stream_leaves_no_thread_reading_its_requests
            ended = threading.Event()
            try:
                self._call = self._producer._stub.Telemetry(self._requests(ended), metadata=self._producer._metadata())
                for command in self._call:
                    check = _readable_check(command)
                    if check is not None:
                        self._answer(*check)
            except (grpc.RpcError, ValueError) as exc:  # ValueError: the channel closed under it
                if not self._stop.is_set():
                    log.debug("transaction check stream broke (%s); opening it again", exc)
            except Exception:  # the thread must not end: checks of this producer's topics would stop for good
                log.exception("transaction check stream failed; opening it again")
            finally:
                ended.set()
            self._stop.wait(RECONNECT_S)

    def _answer(self, message: Message, transaction_id: str) -> None:
        try:
            resolution = None if _own_open(self._producer, message) else self._checker(message)
            if inspect.isawaitable(resolution):
                raise TypeError("the blocking Producer's checker must return True, False or None, not an awaitable")
        except Exception:  # answered unknown, so the proxy has a place for the next check at once
            log.exception("the checker failed on message %s; answered unknown: checked again later", message.message_id)
            resolution = None
        try:
            self._producer._end_transaction(
                message.topic, message.message_id, transaction_id, resolution, from_check=True
            )
        except Exception:
            log.exception("answering the check of message %s failed; it is checked again later", message.message_id)

    def close(self) -> None:
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(timeout=5)


class AsyncCheckStream:
    """The asyncio producer's check stream: a task in the producer's loop."""

    def __init__(self, producer: AsyncProducer, checker: Checker, topics: Sequence[str]) -> None:
        self._producer = producer
        self._checker = checker
        self._settings = _wire.producer_settings(topics, namespace=producer.options.namespace)
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _requests(self, ended: asyncio.Event) -> Any:
        yield self._settings
        await ended.wait()  # grpc.aio's task reading the requests ends with the stream

    async def _run(self) -> None:
        while not self._stop.is_set():
            ended = asyncio.Event()
            try:
                call = self._producer._stub.Telemetry(self._requests(ended), metadata=self._producer._metadata())
                async for command in call:
                    check = _readable_check(command)
                    if check is not None:
                        await self._answer(*check)
            except (grpc.RpcError, errors.PopgateError) as exc:
                log.debug("transaction check stream broke (%s); opening it again", exc)
            except Exception:  # the task must not end: checks of this producer's topics would stop for good
                log.exception("transaction check stream failed; opening it again")
            finally:  # test_transactions.py::test_a_broken_asyncio_check_stream_ends_its_requests
                ended.set()
            try:
                await asyncio.wait_for(self._stop.wait(), RECONNECT_S)
            except TimeoutError:
                pass

    async def _answer(self, message: Message, transaction_id: str) -> None:
        try:
            resolution = None if _own_open(self._producer, message) else self._checker(message)
            if inspect.isawaitable(resolution):
                resolution = await resolution
        except Exception:  # answered unknown, so the proxy has a place for the next check at once
            log.exception("the checker failed on message %s; answered unknown: checked again later", message.message_id)
            resolution = None
        try:
            await self._producer._end_transaction(
                message.topic, message.message_id, transaction_id, resolution, from_check=True
            )
        except Exception:
            log.exception("answering the check of message %s failed; it is checked again later", message.message_id)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
