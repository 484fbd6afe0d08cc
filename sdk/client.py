"""Blocking Producer and SimpleConsumer over the apache.rocketmq.v2 protocol (asyncio twins: `popgate.aio`).

The Producer is here; the SimpleConsumer is in `_sync_consumer`, their connection and retries in `_sync_client`.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc
from popgate_pb.v2 import service_pb2 as pb

from . import _resend, _wire, errors
from ._base import ProducerBase, receipts_so_far, send_window
from ._sync_client import _SyncClient
from ._sync_consumer import SimpleConsumer as SimpleConsumer
from .message import Message, SendReceipt
from .transactions import CheckStream, Transaction

SEND_SHARED = "/popgate.ext.v1.Messaging/SendShared"


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
        checker: Asked about this producer's topics' transactions still unresolved after the broker's immunity
            (see `popgate.transactions`), from the local transaction's record: True commits, False rolls back,
            None asks again later. Checks of this producer's own transactions not ended yet are answered None.
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
            PopgateError: A call failed (after its retries). The calls not yet made are not made; those on
                their way are awaited (within ``request_timeout``, not retried). The error's ``receipts`` say
                which messages are stored: one entry per message, its receipt or None (not sent, refused, or
                not known: a call on its way that timed out may have been stored). Resend only the None
                entries' messages.
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
            shared=self._may_serve("_shared_served"),
        )
        results: list[list[SendReceipt | None] | None] = [None] * len(requests)
        in_flight = send_window(requests)
        window: deque[tuple[int, tuple[Any, bool] | None]] = deque()  # (index, `_begin_send`'s)

        def settle(done: int, begun: tuple[Any, bool] | None) -> None:
            try:
                results[done] = list(self._send(topic, requests[done], begun))
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
        except BaseException as exc:  # the batches not sent yet are not sent
            try:
                while window:  # those on their way end (within their timeout, no retry) and count
                    index, begun = window.popleft()
                    if begun is not None and (isinstance(exc, Exception) or not begun[0].cancel()):
                        results[index] = _stored(topic, requests[index], begun[0])
            except BaseException:  # Ctrl-C while waiting for them: the rest are cancelled, as Ctrl-C cancels
                for _, begun in window:  # test_send_many.py::test_ctrl_c_while_waiting_cancels_the_calls_left
                    if begun is not None:
                        begun[0].cancel()
                raise
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
            Timeout: Not retriable: a retry found it gone after an attempt whose answer was lost (withdrawn by
                that attempt, or delivered meanwhile).
        """
        request = _wire.recall_request(topic, recall_handle, namespace=self.options.namespace)
        attempts = itertools.count(1)

        def op() -> str:
            resent = next(attempts) > 1
            response = self._stub.RecallMessage(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            return _resend.recalled(response, resent=resent)

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

        attempts = itertools.count(1)

        def op() -> None:
            resent = next(attempts) > 1
            response = self._stub.EndTransaction(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            _resend.transaction_ended(response, resent=resent, commit=commit)

        self._retrying(op)

    def _connect(self) -> None:
        super()._connect()
        # popgate.ext.v1 SendShared as a unary call, with the SharedSend serializing itself.
        self._send_shared_ = self._channel_.unary_unary(
            SEND_SHARED, request_serializer=_serialized, response_deserializer=pb.SendMessageResponse.FromString
        )

    @property
    def _send_shared(self) -> Any:
        self._here()
        return self._send_shared_

    @_send_shared.setter
    def _send_shared(self, call: Any) -> None:
        self._send_shared_ = call

    def _open(self) -> None:
        super()._open()
        self._checks = CheckStream(self, self._checker, self._topics) if self._checker is not None else None
        if self._checks is not None:
            self._checks.start()

    def _closing(self) -> None:
        if self._checks is not None:
            self._checks.close()

    def _call(self, request: _wire.SendPlan) -> tuple[Any, Any]:
        """The call that sends `request`, and what it is given: SendShared where the proxy serves it (not known
        yet, or known to), else SendMessage."""
        if not isinstance(request, _wire.SharedSend):
            return self._stub.SendMessage, request
        if self._shared_served is not False:
            return self._send_shared, request
        return self._stub.SendMessage, request.as_v2()

    def _begin_send(self, request: _wire.SendPlan) -> tuple[Any, bool]:
        """The call's future, and whether it went as SendShared."""
        call, given = self._call(request)
        try:
            future = call.future(given, timeout=self.options.request_timeout, metadata=self._metadata())
            return future, isinstance(given, _wire.SharedSend)
        except ValueError:  # grpc's "channel closed": close() from another thread
            if self._closed:
                raise _resend.client_closed() from None
            raise

    def _send(self, topic: str, request: _wire.SendPlan, sent: tuple[Any, bool] | None = None) -> list[SendReceipt]:
        """One SendMessage with the retry policy. ``sent``: the call's future when it is already on its way (and
        whether as SendShared); its outcome is the first attempt. A retry re-sends the same message ids: consumers
        can de-duplicate. A SendShared the proxy has no RPC for (UNIMPLEMENTED: nothing was served) goes again as
        SendMessage, and so do the later ones — tests/unit/sdk/test_send_many.py::
        test_the_producer_sends_as_send_message_to_a_proxy_without_shared_sends."""

        def op() -> list[SendReceipt]:
            nonlocal sent
            try:
                if sent is None:
                    call, given = self._call(request)
                    shared = isinstance(given, _wire.SharedSend)
                    response = call(given, timeout=self.options.request_timeout, metadata=self._metadata())
                else:
                    (future, shared), sent = sent, None
                    response = future.result()
                if shared:  # served as SendShared (one sent as SendMessage tells nothing)
                    self._shared_served = True
            except grpc.RpcError as exc:
                if not shared or not isinstance(request, _wire.SharedSend):
                    raise
                if not self._unimplemented(exc, "_shared_served", "SendShared"):
                    raise
                response = self._stub.SendMessage(
                    request.as_v2(), timeout=self.options.request_timeout, metadata=self._metadata()
                )
            return _wire.send_receipts(topic, request, response)

        return self._retrying(op)


def _serialized(request: _wire.SharedSend) -> bytes:
    return request.SerializeToString()


def _stored(topic: str, request: _wire.SendPlan, future: Any) -> list[SendReceipt | None] | None:
    """The receipts of a finished SendMessage future; None when it failed (those it stored when partly)."""
    try:
        return list(_wire.send_receipts(topic, request, future.result()))
    except errors.PopgateError as exc:
        return exc.receipts
    except (grpc.RpcError, grpc.FutureCancelledError):  # failed, or cancelled by close()
        return None
