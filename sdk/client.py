"""Blocking Producer and SimpleConsumer over the apache.rocketmq.v2 protocol (asyncio twins: `popgate.aio`)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
import grpc.experimental
from popgate_pb.ext import messaging_pb2_grpc as ext_grpc
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from . import _resend, _wire, errors
from ._acks import ThreadAcks
from ._base import ClientBase, ConsumerBase, ProducerBase, log_give_back_failures, receipts_so_far, send_window
from ._transport import CHANNEL_OPTIONS, channel_credentials, convert
from .message import Message, SendReceipt
from .transactions import CheckStream, Transaction

log = logging.getLogger(__name__)
T = TypeVar("T")


# ReceiveMessage streams one frame per message: a sync client reads them on the calling thread instead of
# having grpc's channel thread hand each over (grpc's experimental channel option; its cost is in docs/SDK.md).
_SYNC_OPTIONS = [*CHANNEL_OPTIONS, (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]


class _SyncClient(ClientBase):
    def _open(self) -> None:
        creds = channel_credentials(self.options)
        target = self.options.endpoint
        if creds is None:
            self._channel = grpc.insecure_channel(target, options=_SYNC_OPTIONS)
        else:
            self._channel = grpc.secure_channel(target, creds, options=_SYNC_OPTIONS)
        self._stub = pb_grpc.MessagingServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._ext = ext_grpc.MessagingStub(self._channel)  # type: ignore[no-untyped-call]

    def _retrying(self, op: Callable[[], T], *, forever: bool = False) -> T:
        delays = self.options.retry.delays(forever=forever)
        while True:
            try:
                try:
                    return op()
                except (grpc.RpcError, ValueError) as exc:  # ValueError: a call on a channel closed meanwhile
                    if self._closed:
                        raise errors.Unavailable("the client is closed", retriable=False) from None
                    if not isinstance(exc, grpc.RpcError):
                        raise
                    raise convert(exc, tls=self.options.tls) from None
            except errors.PopgateError as exc:
                delay = next(delays, None) if exc.retriable and not self._closed else None
                if delay is None:
                    raise
                log.debug("retrying in %.3f s after %s", delay, exc)
                self._back_off(delay, exc)

    def _back_off(self, delay: float, exc: errors.PopgateError) -> None:
        """Wait ``delay`` seconds before a retry. After an Unavailable, a Heartbeat that waits for the channel
        (up to the delay) keeps it polled meanwhile: on grpc's poller I/O a sync channel's reconnect timers run
        only while a call polls it, so a producer reaches a restarted proxy within its retries
        (tests/integration/sdk/test_restarts.py::test_a_producer_reconnects_to_a_restarted_proxy_within_its_retries).
        The retry still waits out its delay."""
        ends = time.monotonic() + delay
        if isinstance(exc, errors.Unavailable):
            with contextlib.suppress(grpc.RpcError, ValueError):  # not ready in time, or closed meanwhile
                self._stub.Heartbeat(
                    pb.HeartbeatRequest(), timeout=delay, metadata=self._metadata(), wait_for_ready=True
                )
        time.sleep(max(0.0, ends - time.monotonic()))

    def close(self) -> None:
        """Close the connection; calls in progress end with an error (a consumer's iteration just stops, after
        giving back the messages it had not yielded yet)."""
        if not self._closed:
            self._closed = True
            try:
                self._closing()
            finally:
                self._channel.close()

    def _closing(self) -> None:
        """What to do between marking the client closed and closing its channel."""

    def __enter__(self) -> Self:
        """The client itself; leaving the ``with`` block closes it."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Producer(ProducerBase, _SyncClient):
    """Sends messages through a popgate (or RocketMQ 5) proxy. Thread-safe; use as a context manager.

    Args:
        endpoint: The proxy's ``HOST:PORT``.
        access_key: Access key for the v2 ``authorization`` header (with ``secret_key``).
        secret_key: Secret key that signs each call (never sent).
        tls: False for plaintext, True for TLS with the system's roots, or a path to a PEM file of roots
            (ValueError when it holds no PEM certificate).
        namespace: v2 resource namespace: topics and groups of one namespace are apart from another's on
            the same cluster (popgate keeps them apart as RocketMQ does; empty: none).
        request_timeout: Deadline of each call, seconds (at most 7 days, as every duration the SDK takes).
        retry: Back-off for retriable errors (overload, broker failover, proxy restarts).
        checker: Asked about this producer's topics' transactions their producer left unresolved (see
            `popgate.transactions`): True commits, False rolls back, None asks again later.
        topics: The topics whose transactions ``checker`` is asked about (needed with it).

    Example:
        >>> with Producer("127.0.0.1:8081") as producer:  # doctest: +SKIP
        ...     receipt = producer.send("orders", b"hello", tag="new")
    """

    def send(
        self,
        topic: str,
        body: bytes | str | Message,
        *,
        tag: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        delay: float | None = None,
        deliver_at: float | None = None,
        message_group: str | None = None,
        priority: int | None = None,
    ) -> SendReceipt:
        """Send one message and wait until a broker stored it.

        Args:
            topic: Destination topic (created on first send).
            body: Payload; ``str`` is sent as UTF-8.
            tag: Optional tag consumers can filter on.
            keys: Optional business keys.
            properties: User properties.
            delay: Deliver this many seconds from now.
            deliver_at: Deliver at this time (seconds since the epoch); not with ``delay``.
            message_group: FIFO group: messages of one group go to one queue in order.
            priority: Priority >= 0: among a queue's ready messages a higher one is delivered first (not with
                ``message_group`` or a delay).

        Returns:
            The receipt with the message id (and a scheduled message's ``recall_handle``).

        Raises:
            PopgateError: A typed subclass once retries are exhausted or the error is not retriable.
        """
        return self.send_many(
            topic,
            [body],
            tag=tag,
            keys=keys,
            properties=properties,
            delay=delay,
            deliver_at=deliver_at,
            message_group=message_group,
            priority=priority,
        )[0]

    def send_many(
        self,
        topic: str,
        messages: Iterable[bytes | str | Message],
        *,
        tag: str | None = None,
        keys: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
        delay: float | None = None,
        deliver_at: float | None = None,
        message_group: str | None = None,
        priority: int | None = None,
    ) -> list[SendReceipt]:
        """Send many messages in batched SendMessage calls (up to 1024 per call, several calls in flight).

        Options apply to every item that does not set them itself (items may be `Message` objects). One
        body or one `Message` given as ``messages`` is a TypeError (a str would be sent letter by letter): use `send`.

        Args:
            topic: The topic every message goes to.
            messages: Bodies (bytes, or str sent as UTF-8) or `Message` objects.
            tag: Tag of the items that set none.
            keys: Keys of the items that set none.
            properties: User properties of the items that set none.
            delay: Deliver this many seconds after the send (not with ``message_group``).
            deliver_at: Deliver at this Unix time, seconds (not with ``delay``).
            message_group: FIFO message group: its messages are consumed in order.
            priority: Priority of the items that set none (see `send`).

        Returns:
            One receipt per message, in order.

        Raises:
            PopgateError: A call failed (after its retries). The calls not yet made are not made, those on
                their way are cancelled. The error's ``receipts`` say which messages are stored: one entry
                per message, its receipt or None (not sent, refused, or not known: a call cancelled on its
                way may have been stored). Resend only the None entries' messages.
        """
        requests = self._plan(
            topic,
            messages,
            tag=tag,
            keys=keys,
            properties=properties,
            delay=delay,
            deliver_at=deliver_at,
            message_group=message_group,
            priority=priority,
        )
        results: list[list[SendReceipt | None] | None] = [None] * len(requests)
        in_flight = send_window(requests)
        window: deque[tuple[int, Any]] = deque()  # (index, its call's future)

        def settle(done: int, future: Any) -> None:
            try:
                results[done] = list(self._send(topic, requests[done], future))
            except errors.PopgateError as exc:
                results[done] = exc.receipts  # those of a partly stored request, else None
                raise

        try:
            for index, request in enumerate(requests):
                window.append((index, self._begin_send(request) if len(requests) > 1 else None))
                if len(window) >= in_flight:
                    settle(*window.popleft())
            while window:
                settle(*window.popleft())
        except BaseException as exc:  # the batches not sent yet are not sent; those on their way are cancelled
            for index, future in window:
                if future is not None and not future.cancel():  # it has its answer already
                    results[index] = _stored(topic, requests[index], future)
            if isinstance(exc, errors.PopgateError):
                exc.receipts = receipts_so_far(requests, results)
            raise
        return [receipt for got in results for receipt in got or () if receipt is not None]

    def recall(self, topic: str, recall_handle: str) -> str:
        """Withdraw a scheduled message before its delivery time: it is never delivered.

        Args:
            topic: Its topic.
            recall_handle: Its SendReceipt's ``recall_handle``.

        Returns:
            The recalled message's id.

        Raises:
            NotFound: It is not waiting any more (delivered, being delivered, or recalled already).
            BadRequest: The handle is not one.
        """
        request = _wire.recall_request(topic, recall_handle, namespace=self.options.namespace)

        def op() -> str:
            response = self._stub.RecallMessage(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            _wire.check(response.status)
            return str(response.message_id)

        return self._retrying(op)

    def transaction(self) -> Transaction:
        """A transaction: its ``send`` stores half messages no consumer sees until it commits.

        Example:
            >>> with producer.transaction() as tx:  # doctest: +SKIP
            ...     tx.send("orders", b"created")
            ...     save_order()  # raises: the message is rolled back; returns: it is committed
        """
        return Transaction(self)

    def _send_half(self, topic: str, body: bytes | str | Message, **options: Any) -> SendReceipt:
        plan = self._plan(topic, [body], delay=None, deliver_at=None, message_group=None, transactional=True, **options)
        return self._send(topic, plan[0])[0]

    def _end_transaction(
        self, topic: str, message_id: str, transaction_id: str, commit: bool | None, *, from_check: bool
    ) -> None:
        namespace = self.options.namespace
        request = _wire.end_transaction_request(
            topic, message_id, transaction_id, commit, from_check=from_check, namespace=namespace
        )

        def op() -> None:
            response = self._stub.EndTransaction(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            _wire.check(response.status)

        self._retrying(op)

    def _open(self) -> None:
        super()._open()
        self._checks = CheckStream(self, self._checker, self._topics) if self._checker is not None else None
        if self._checks is not None:
            self._checks.start()

    def _closing(self) -> None:
        if self._checks is not None:
            self._checks.close()

    def _begin_send(self, request: pb.SendMessageRequest) -> Any:
        try:
            return self._stub.SendMessage.future(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
        except ValueError:  # grpc's "channel closed": close() from another thread
            if self._closed:
                raise errors.Unavailable("the client is closed", retriable=False) from None
            raise

    def _send(self, topic: str, request: pb.SendMessageRequest, sent: Any = None) -> list[SendReceipt]:
        """One SendMessage with the retry policy. ``sent``: the call's future when it is already on its way;
        its outcome is the first attempt. A retry re-sends the same message ids: consumers can de-duplicate."""

        def op() -> list[SendReceipt]:
            nonlocal sent
            if sent is None:
                response = self._stub.SendMessage(
                    request, timeout=self.options.request_timeout, metadata=self._metadata()
                )
            else:
                future, sent = sent, None
                response = future.result()
            return _wire.send_receipts(topic, request, response)

        return self._retrying(op)


def _stored(topic: str, request: pb.SendMessageRequest, future: Any) -> list[SendReceipt | None] | None:
    """The receipts of a finished SendMessage future; None when it failed (those it stored when partly)."""
    try:
        return list(_wire.send_receipts(topic, request, future.result()))
    except errors.PopgateError as exc:
        return exc.receipts
    except grpc.RpcError:
        return None


class SimpleConsumer(ConsumerBase, _SyncClient):
    """Receives messages of a consumer group; you ack each one (or nack it, or forward it to the DLQ).

    A received message stays invisible to the group for ``invisible`` seconds; unless acked
    by then it is delivered again with ``attempt + 1``. Iterating (``for msg in consumer``)
    long-polls forever, retrying transient failures (proxy or broker restarts) with back-off;
    it ends when the consumer is closed. An iteration left early (``break``, an error in the loop's
    body, the consumer closed) gives back the messages of its batch it had not yielded yet: ready
    again at once, with ``attempt + 1`` (a nack with delay 0; best effort, at most 1 s).

    Args:
        endpoint: The proxy's ``HOST:PORT``.
        group: Consumer group name.
        subscriptions: ``{topic: filter}`` where filter is ``"*"`` or tags ``"a || b"``; or topic names.
            Several topics are polled in turn, one per receive.
        batch: Default ``max`` for `receive` and for iteration (1..32).
        invisible: Default invisibility, seconds (a popgate or RocketMQ proxy accepts 10 s .. 12 h).
        wait: Default long-polling time, seconds. Iteration long-polls at least 1 s per receive (``wait=0``
            would make it a busy loop); a held receive still answers as soon as a message comes.
        access_key, secret_key, tls, namespace, request_timeout, retry: As for `Producer`.
    """

    def receive(
        self, *, max: int | None = None, invisible: float | None = None, wait: float | None = None
    ) -> list[Message]:
        """Receive up to ``max`` messages, long-polling up to ``wait`` seconds; ``[]`` when none came.

        Args:
            max: At most this many messages (1..32).
            invisible: Seconds the messages stay invisible to the group unless acked.
            wait: Long-polling time, seconds (0: answer at once).
        """
        return self._retrying(lambda: self._receive_once(max, invisible, wait))

    def _receive_once(self, max: int | None, invisible: float | None, wait: float | None) -> list[Message]:
        request, timeout = self._receive_plan(max, invisible, wait)
        metadata = self._metadata()
        if self._batch_receive is not False:  # many messages per frame, where the proxy serves it
            try:
                messages = _wire.received(self._ext.ReceiveMessages(request, timeout=timeout, metadata=metadata))
            except grpc.RpcError as exc:
                if not self._batch_unimplemented(exc):
                    raise
            else:
                self._batch_receive = True
                return messages
        return _wire.received(self._stub.ReceiveMessage(request, timeout=timeout, metadata=metadata))

    def __iter__(self) -> Iterator[Message]:
        """Messages as they come, long-polling forever (transient failures retried without end); ends when the
        client is closed. Messages received but not yet yielded when the loop ends are given back at once."""
        while not self._closed:
            try:
                batch = self._retrying(lambda: self._receive_once(None, None, self._iteration_wait), forever=True)
            except errors.PopgateError:
                if self._closed:
                    return
                raise
            key = self._unyielded.start(batch)
            try:
                while not self._closed and (message := self._unyielded.next(key)) is not None:
                    yield message
            finally:  # also at `break` (the generator closed), an error in the loop's body, or close()
                self._give_back(self._unyielded.end(key))

    def _open(self) -> None:
        super()._open()
        self._unwaited = ThreadAcks(log)

    def close(self) -> None:
        """Close the connection, once the acks not waited for have ended (at most 10 s); see `_SyncClient.close`."""
        try:
            if not self._closed:
                self._unwaited.stop()
        finally:
            super().close()

    def _closing(self) -> None:
        self._give_back(self._unyielded.take_all())  # what iterations in progress had not yielded yet

    def _give_back(self, messages: list[Message]) -> None:
        """Make received messages that nobody will handle ready again at once (a nack with delay 0) rather than
        invisible for ``invisible`` seconds. Best effort: one attempt each, all at once, at most
        GIVE_BACK_TIMEOUT_S; a failure is logged at DEBUG (that message comes back after ``invisible``)."""
        if not messages or sys.is_finalizing():  # the interpreter is exiting: grpc could start no thread
            return
        timeout = self._give_back_timeout
        try:
            calls = [
                self._stub.ChangeInvisibleDuration.future(request, timeout=timeout, metadata=self._metadata())
                for request in self._give_back_plan(messages)
            ]
        except ValueError:  # grpc's "channel closed": close() from another thread
            return
        log_give_back_failures(log, [call.exception() or call.result() for call in calls])

    def ack(self, message: Message, *, wait: bool = True) -> None:
        """Acknowledge one message: it is consumed and never delivered again.

        Transient failures (UNAVAILABLE, TOO_MANY_REQUESTS, broker failover, timeouts) are retried under
        the client's `RetryPolicy`. A re-sent ack answered with a stale handle counts as acked: the broker
        refuses a handle it already acked, so that answer means an earlier attempt whose reply was lost
        did the ack. After a broker crash that answer may mean the opposite (the restarted broker lost the
        ack, or the delivery itself): then a normal return is followed by one more delivery of the message
        (at least once, docs/SDK.md "Errors and retries").

        Args:
            message: A message this consumer received.
            wait: False: return at once and let the ack go on in the background, as NATS's ``msg.ack()`` or
                RocketMQ's ``ackAsync`` (docs/SDK.md "Consume"): a failure is logged at WARNING and the message
                comes again after its invisible time. At most 64 such ack calls are queued or under way per
                consumer (one more waits for one of them); `close` waits for them, at most 10 s.

        Raises:
            InvalidReceiptHandle: The handle is stale (redelivered since, or already acked); only when waiting.
            Unavailable: With ``wait=False``, the consumer is closed (or closing).
        """
        if not wait:
            self.ack_many([message], wait=False)
            return
        failures = self._ack(self._ack_plan([message]))
        if failures:
            raise failures[0][1]

    def ack_many(self, messages: Iterable[Message], *, wait: bool = True) -> None:
        """Acknowledge many messages in as few AckMessage calls as possible (one per topic and 1024).

        Entries that fail with a retriable error are re-sent alone, as `ack` retries.

        Args:
            messages: Messages this consumer received.
            wait: False: return at once and let the acks go on in the background, as `ack` says.

        Raises:
            AckError: Some messages were not acked; ``failures`` lists them with their errors. Only when waiting.
            Unavailable: With ``wait=False``, the consumer is closed (or closing).
        """
        plan = self._ack_plan(messages)  # a bad argument raises here, to the caller, waiting or not
        if not wait:
            self._unwaited.start(lambda: self._ack(plan), sum(len(r.entries) for r in plan))
            return
        failures = self._ack(plan)
        if failures:
            raise errors.AckError(failures)

    def _ack(self, plan: list[pb.AckMessageRequest]) -> list[tuple[str, errors.PopgateError]]:
        failures: list[tuple[str, errors.PopgateError]] = []
        for request in plan:
            failures += self._ack_request(_resend.PendingAck(request))
        return failures

    def _ack_request(self, pending: _resend.PendingAck) -> list[tuple[str, errors.PopgateError]]:
        def op() -> list[tuple[str, errors.PopgateError]]:
            request = pending.next_request()
            response = self._stub.AckMessage(request, timeout=self.options.request_timeout, metadata=self._metadata())
            return pending.read(response)

        try:
            return self._retrying(op)
        except errors.PopgateError as exc:
            return pending.given_up(exc)

    def nack(self, message: Message, delay: float = 0.0) -> Message:
        """Give a message back: it is delivered again after ``delay`` seconds (ChangeInvisibleDuration).

        The message's ``receipt_handle`` is replaced by the new one (also returned). Transient failures
        are retried as for `ack`.

        Args:
            message: A message this consumer received.
            delay: Seconds until it is delivered again (0: at once).

        Returns:
            The same message, with its new receipt handle.

        Raises:
            InvalidReceiptHandle: The handle was stale at the first attempt.
            Timeout: Not retriable: the outcome is unknown. An attempt failed in a way that may have
                reached the broker, and the retry found the handle already replaced, most likely by that
                attempt; the message will be delivered again after ``delay``, but the new handle was lost.
        """
        request = _wire.change_invisible_request(self.group, message, delay, namespace=self.options.namespace)
        attempts = itertools.count(1)

        def op() -> str:
            resent = next(attempts) > 1
            response = self._stub.ChangeInvisibleDuration(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            return _resend.new_handle(response, resent=resent)

        message.receipt_handle = self._retrying(op)
        return message

    def forward_to_dlq(self, message: Message) -> None:
        """Move a message to the group's dead-letter topic ``%DLQ%<group>`` now.

        Retried as `ack` is; a re-send answered with a stale handle counts as forwarded.

        Args:
            message: A message this consumer received.
        """
        request = _wire.dlq_request(self.group, message, namespace=self.options.namespace)
        attempts = itertools.count(1)

        def op() -> None:
            resent = next(attempts) > 1
            response = self._stub.ForwardMessageToDeadLetterQueue(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            _resend.dead_lettered(response, resent=resent)

        self._retrying(op)
