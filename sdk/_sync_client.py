"""The blocking clients' connection: their grpc channel, calls retried under the client's RetryPolicy with
back-off, and close (a `with` block closes the client). `popgate.client.Producer` and `SimpleConsumer` build on it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
import grpc.experimental
from popgate_pb.ext import messaging_pb2_grpc as ext_grpc
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from . import _resend, errors
from ._acks import CLOSE_WAIT_S
from ._base import GIVE_BACK_TIMEOUT_S, ClientBase
from ._transport import CHANNEL_OPTIONS, channel_credentials, convert

# The blocking clients log as `popgate.client`, the module they are imported from (tests/unit/sdk/test_acks.py).
log = logging.getLogger("popgate.client")
T = TypeVar("T")


# ReceiveMessage streams one frame per message: a sync client reads them on the calling thread instead of
# having grpc's channel thread hand each over (grpc's experimental channel option; its cost is in docs/SDK.md).
_SYNC_OPTIONS = [*CHANNEL_OPTIONS, (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]


# How long a close() waits for another thread's to end: past all that one waits for (the acks not waited for,
# CLOSE_WAIT_S; then the reads, the held batches' give-back and the iterations' own, GIVE_BACK_TIMEOUT_S each) and
# one more, yet not for good should that one wait for the caller (a signal handler's close() on a thread holding a
# lock the first needs) —
# tests/unit/sdk/test_acks.py::test_a_close_in_a_signal_handler_never_waits_for_good_for_another_threads_close.
SECOND_CLOSE_WAIT_S = CLOSE_WAIT_S + 4 * GIVE_BACK_TIMEOUT_S

# Channels a forked child inherited and replaced: kept referenced, never closed nor collected, since their grpc
# state may hold locks that threads of the parent held at the fork.
_inherited: list[grpc.Channel] = []
_reconnecting = threading.Lock()


def _new_lock_in_child() -> None:
    global _reconnecting
    _reconnecting = threading.Lock()  # another thread of the parent may have held it at the fork


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_new_lock_in_child)


class _SyncClient(ClientBase):
    """A forked child's first call on a client it inherited opens a channel of its own, so a call that another
    thread of the parent was making at the fork holds up none of the child's —
    tests/integration/sdk/test_fork.py::test_children_forked_while_parent_threads_are_mid_call_use_the_inherited_clients.
    """

    def _open(self) -> None:
        self._closing_now = threading.Event()  # set by close(): a retry's back-off ends at once
        self._closed_fully = threading.Event()  # set once the first close() has closed the channel
        self._connect()
        self._pid = os.getpid()  # once every stub of the channel is made (a subclass's `_connect` adds its own)

    def _connect(self) -> None:
        """Open the channel of this process."""
        creds = channel_credentials(self.options)
        target = self.options.endpoint
        if creds is None:
            self._channel_ = grpc.insecure_channel(target, options=_SYNC_OPTIONS)
        else:
            self._channel_ = grpc.secure_channel(target, creds, options=_SYNC_OPTIONS)
        self._stub_ = pb_grpc.MessagingServiceStub(self._channel_)  # type: ignore[no-untyped-call]
        self._ext_ = ext_grpc.MessagingStub(self._channel_)  # type: ignore[no-untyped-call]

    def _here(self) -> None:
        """In a forked child, replace the inherited channel with one of this process (once); none for a client closed
        (Unavailable) — tests/unit/sdk/test_close_interleavings.py::
        test_a_consumer_closed_before_a_fork_sends_nothing_in_the_child."""
        if self._pid != os.getpid():
            if self._closed:
                raise _resend.client_closed()
            with _reconnecting:
                if self._pid != os.getpid():
                    _inherited.append(self._channel_)
                    self._connect()
                    self._pid = os.getpid()  # last: another thread sees the new pid only with every new stub

    @property
    def _channel(self) -> grpc.Channel:
        self._here()
        return self._channel_

    @_channel.setter
    def _channel(self, channel: grpc.Channel) -> None:
        self._channel_ = channel

    @property
    def _stub(self) -> Any:
        self._here()
        return self._stub_

    @_stub.setter
    def _stub(self, stub: Any) -> None:
        self._stub_ = stub

    @property
    def _ext(self) -> Any:
        self._here()
        return self._ext_

    @_ext.setter
    def _ext(self, stub: Any) -> None:
        self._ext_ = stub

    def _retrying(
        self, op: Callable[[], T], *, forever: bool = False, failed: Callable[[errors.PopgateError], None] | None = None
    ) -> T:
        """`op`, retried under the retry policy; `failed` is told of each attempt's error."""
        delays = self.options.retry.delays(forever=forever)
        maybe = False  # an attempt may have been applied
        while True:
            try:
                try:
                    return op()
                except (grpc.RpcError, ValueError) as exc:  # ValueError: a call on a channel closed meanwhile
                    if self._closed:
                        raise _resend.client_closed(sent=isinstance(exc, grpc.RpcError)) from None
                    if not isinstance(exc, grpc.RpcError):
                        raise
                    raise convert(exc, tls=self.options.tls) from None
            except errors.PopgateError as caught:
                error = _resend.after_maybe_applied(caught) if maybe else caught
                maybe = maybe or _resend.maybe_applied(error)
                if failed is not None:
                    failed(error)
                delay = next(delays, None) if error.retriable and not self._closed else None
                if delay is None:
                    raise error from None
                log.debug("retrying in %.3f s after %s", delay, error)
                self._back_off(delay, error)

    def _back_off(self, delay: float, exc: errors.PopgateError) -> None:
        """Wait ``delay`` seconds before a retry. After an Unavailable, a Heartbeat that waits for the channel
        (up to the delay) keeps it polled meanwhile: on grpc's poller I/O a sync channel's reconnect timers run
        only while a call polls it, so a producer reaches a restarted proxy within its retries
        (tests/integration/sdk/test_restarts.py::test_a_producer_reconnects_to_a_restarted_proxy_within_its_retries).
        The retry still waits out its delay, unless close() ends it —
        tests/unit/sdk/test_acks.py::test_close_ends_a_retrys_back_off_at_once."""
        ends = time.monotonic() + delay
        if isinstance(exc, errors.Unavailable):
            with contextlib.suppress(grpc.RpcError, ValueError):  # not ready in time, or closed meanwhile
                self._stub.Heartbeat(
                    pb.HeartbeatRequest(), timeout=delay, metadata=self._metadata(), wait_for_ready=True
                )
        self._closing_now.wait(max(0.0, ends - time.monotonic()))

    def close(self) -> None:
        """Close the connection; calls in progress end with an error (a consumer's iteration just stops, after
        giving back the messages it had not yielded yet). A close() while another thread's is under way returns
        once that one has closed the channel — tests/unit/sdk/test_acks.py::
        test_a_second_close_returns_once_the_first_has_closed_the_channel — except on the closing thread itself
        (a signal handler's), which returns at once."""
        me = (os.getpid(), threading.get_ident())
        closer = self.__dict__.setdefault("_closer", me)  # one close only: the first to claim it (one step)
        if closer[0] != me[0]:  # a parent's close(), under way at the fork: the child closes what is its own —
            closer = self.__dict__["_closer"] = me  # test_fork.py::test_a_child_forked_during_close_can_close
        if closer is not me:
            if closer != me:  # another thread's: once it has closed the channel (not one its own thread runs)
                self._closed_fully.wait(SECOND_CLOSE_WAIT_S)
            return
        try:
            self._stopping()
        finally:
            self._closed = True
            self._closing_now.set()
            try:
                self._closing()
            finally:
                self._end_channel()

    @property
    def _close_called(self) -> bool:
        return "_closer" in self.__dict__

    def _end_channel(self) -> None:
        """Close the channel (not an inherited one: left as it is) — a subclass may put this off."""
        if self._pid == os.getpid():
            self._channel_.close()
        self._closed_fully.set()

    def _stopping(self) -> None:
        """What to do before marking the client closed (its calls still go)."""

    def _closing(self) -> None:
        """What to do between marking the client closed and closing its channel."""

    def __enter__(self) -> Self:
        """The client itself; leaving the ``with`` block closes it."""
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
