"""The asyncio clients' connection: their grpc channel, made in the event loop of first use, the proxy's
Session stream where it serves one, calls retried under the client's RetryPolicy, and close (an `async with`
block closes the client). `popgate.aio.Producer` and `SimpleConsumer` build on it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncGenerator, Awaitable, Callable
from types import TracebackType
from typing import Any, Self, TypeVar

import grpc
from popgate_pb.ext import messaging_pb2_grpc as ext_grpc
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from . import _resend, _session, errors
from ._again import WaitSpent
from ._base import ClientBase
from ._served import Served
from ._transport import CHANNEL_OPTIONS, channel_credentials, convert

STREAM_EVENTS_S = 0.05  # how long a loop's end waits for a cancelled Session stream's last events from grpc
# The asyncio clients log as `popgate.aio`, the module they are imported from (tests/unit/sdk/test_ack_nowait.py).
log = logging.getLogger("popgate.aio")
T = TypeVar("T")


def answered(answer: T | None) -> T:
    """A grpc.aio call's answer. grpc.aio hands back None for one that does not decode (and logs why), where the
    blocking grpc raises INTERNAL: the same ServerError as the blocking client's, not retried —
    tests/unit/sdk/test_undecodable.py."""
    if answer is None:
        raise errors.ServerError(
            "Exception deserializing response! (the server's answer does not decode)", code_name="INTERNAL"
        )
    return answer


# The process in which popgate.aio made its first channel: grpc's asyncio support does not work in a process forked
# from it, so a child's first call says so instead of waiting out its retries —
# tests/integration/sdk/test_fork.py::test_asyncio_clients_in_the_child_of_a_parent_that_used_them_say_so.
_used_in_pid: int | None = None
FORKED_AFTER_USE = (
    "popgate.aio cannot be used in this process: it was forked from a process that had used popgate.aio, and "
    "grpc's asyncio support does not work in such a child (its calls never complete). Make asyncio clients only in "
    "processes started with multiprocessing's 'spawn' or 'forkserver' method, or fork before the parent's first "
    "popgate.aio call; the blocking clients (popgate.Producer, popgate.SimpleConsumer) work in a forked child"
)


def _check_process() -> None:
    global _used_in_pid
    if _used_in_pid is None:
        _used_in_pid = os.getpid()
    elif _used_in_pid != os.getpid():
        raise RuntimeError(FORKED_AFTER_USE)


class _AsyncClient(ClientBase):
    _channel: grpc.aio.Channel | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    # The proxy's Session stream (sdk/_session.py), opened on first use; whether the proxy serves one: None until
    # a request tells, False once it answered UNIMPLEMENTED (then the unary RPCs serve every request: `Served`).
    _session: _session.Session | None = None
    _session_served = Served()
    _closed_future: asyncio.Future[None] | None = None  # set once closed: a second close() waits for the first's
    _backing_off: set[asyncio.Future[None]] | None = None  # retries' back-offs, each ended at once by close()
    _shutdown_guard: AsyncGenerator[None, None] | None = None  # see `_awaited_at_shutdown`
    _guard_loop: asyncio.AbstractEventLoop | None = None  # the loop whose shutdown closes the guard

    @property
    def _stub(self) -> Any:
        # The channel binds to the running loop, so it is made on first use inside it.
        loop = asyncio.get_running_loop()
        _check_process()
        if self._channel is not None and self._loop is not None and self._loop is not loop:
            if not self._loop.is_closed():
                raise RuntimeError(
                    "an popgate.aio client works in the event loop it was first used in, and that loop is not "
                    "closed: make one client per event loop"
                )
            # Its first loop is closed (asyncio.run again, a test per loop): that channel died with it.
            self._channel = self._session = None
        if self._channel is None:
            if self._closed:
                raise _resend.client_closed()
            creds = channel_credentials(self.options)
            target = self.options.endpoint
            if creds is None:
                self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
            else:
                self._channel = grpc.aio.secure_channel(target, creds, options=CHANNEL_OPTIONS)
            self._stub_ = pb_grpc.MessagingServiceStub(self._channel)  # type: ignore[no-untyped-call]
            self._ext_stub_ = ext_grpc.MessagingStub(self._channel)  # type: ignore[no-untyped-call]
            self._loop = loop
            self._guard_loop_end(loop)
        return self._stub_

    def _guard_loop_end(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have `loop`'s shutdown run `_awaited_at_shutdown` (one guard per loop: a client used again in a later loop,
        its first one closed, needs one that loop's shutdown closes)."""
        if self._shutdown_guard is None or self._guard_loop is not loop:
            guard = self._shutdown_guard = self._awaited_at_shutdown()
            self._guard_loop = loop
            try:  # to its `yield` at once (it awaits nothing before): the running loop now knows it
                guard.asend(None).send(None)
            except StopIteration:
                pass

    async def _awaited_at_shutdown(self) -> AsyncGenerator[None, None]:
        # asyncio.run cancels the loop's tasks, then closes every open async generator (loop.shutdown_asyncgens),
        # then closes the loop. This generator, open from the loop's first use on, has that shutdown end what the
        # client runs in the background (`_loop_ending`) and then close the loop's connection, which would
        # otherwise keep handing grpc's events to the closed loop; the next loop opens a new one —
        # tests/integration/sdk/test_aio.py::test_a_client_kept_across_event_loops_closes_each_loops_connection.
        try:
            yield
        finally:
            await self._loop_ending()
            if not self._closed:  # else close() closes them
                await self._close_connection()

    async def _loop_ending(self) -> None:
        """What to wait for as the event loop shuts down, before its connection closes."""

    async def _close_connection(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
            # The loop's end cancelled the stream's tasks first; grpc hands the stream's last events to this loop a
            # moment after (from its poller thread), so the loop runs on that long rather than leave them to a
            # closed loop (no API waits for them).
            await asyncio.sleep(STREAM_EVENTS_S)
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    def _orphaned(self, messages: list[Any]) -> None:
        """Messages of a receive's answer nobody waits for any more (the consumer gives them back)."""

    async def _over_session(self, kind: str, request: Any, within_s: float) -> Any:
        """The answer to `request` over the Session stream (a receive's: its frames); None when the proxy serves
        no Session (the caller then makes its unary call: nothing was served). A lost stream raises a retriable
        Unavailable and the next request opens a new one — tests/integration/sdk/test_session.py."""
        if self._session_served is False:
            return None
        _ = self._stub  # the channel, made in this loop (Unavailable once the client is closed)
        session = self._session
        if session is None or session.broken is not None:
            if self._closed:
                # Closing opens no new stream on the channel it is about to close: a give-back takes the unary call,
                # which close() waits for before the channel closes —
                # tests/unit/sdk/test_give_back.py::test_a_batch_answered_as_close_begins_is_given_back_on_one_stream.
                if kind == "receive":
                    raise _resend.client_closed()
                return None
            assert self._channel is not None
            convert_ = functools.partial(convert, tls=self.options.tls)
            session = self._session = _session.Session(self._channel, self._metadata(), convert_, self._orphaned)
        try:
            answer = await session.request(kind, request, within_s)
        except _session.Unimplemented:
            self._not_served("_session_served", "%s serves no Session stream: using the unary RPCs")
            return None
        self._session_served = True
        return answer

    @property
    def _ext_stub(self) -> Any:
        """popgate's extensions (proto/ext/messaging.proto), on the same channel."""
        _ = self._stub  # the channel, made in this loop
        return self._ext_stub_

    async def _retrying(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        forever: bool = False,
        failed: Callable[[errors.PopgateError], None] | None = None,
    ) -> T:
        """`op`, retried under the retry policy; `failed` is told of each attempt's error."""
        delays = self.options.retry.delays(forever=forever)
        maybe = False  # an attempt may have been applied
        while True:
            try:
                try:
                    return await op()
                except grpc.RpcError as exc:
                    if self._closed:
                        raise _resend.client_closed(sent=True) from None
                    raise convert(exc, tls=self.options.tls) from None
                except asyncio.CancelledError:
                    # Closing the channel cancels its calls; only a cancellation of *this* task propagates.
                    task = asyncio.current_task()
                    if self._closed and task is not None and not task.cancelling():
                        raise _resend.client_closed(sent=True) from None
                    raise
            except errors.PopgateError as caught:
                error = _resend.after_maybe_applied(caught) if maybe else caught
                maybe = maybe or _resend.maybe_applied(error)
                if failed is not None:
                    failed(error)
                again = error.retriable and not self._closed and (forever or not isinstance(error, WaitSpent))
                delay = next(delays, None) if again else None
                if delay is None:
                    raise error from None
                log.debug("retrying in %.3f s after %s", delay, error)
                await self._back_off(delay)

    async def _back_off(self, delay: float) -> None:
        """Wait `delay` seconds before a retry, or until close() begins —
        tests/unit/sdk/test_acks.py::test_close_ends_an_asyncio_retrys_back_off_at_once."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._backing_off is None:
            self._backing_off = set()
        self._backing_off.add(woken)
        try:
            await asyncio.wait({woken}, timeout=delay)
        finally:
            self._backing_off.discard(woken)

    @property
    def _close_called(self) -> bool:
        return self._closed_future is not None

    async def close(self) -> None:
        """Close the connection; calls in progress are cancelled (a consumer's iteration just stops, after giving
        back the messages it had not yielded yet, and give-backs of cancelled receives end first)."""
        if self._closed_future is None:
            self._closed_future = asyncio.get_running_loop().create_future()
            for woken in self._backing_off or ():
                if not woken.done():
                    woken.set_result(None)
            try:
                await self._close()
            finally:
                self._closed_future.set_result(None)
        elif not self._closed_future.done():
            await asyncio.shield(self._closed_future)

    async def _close(self) -> None:
        try:
            if not self._closed:
                try:
                    await self._stopping()
                finally:
                    self._closed = True
                if self._channel is not None:
                    await self._closing()
        finally:
            if self._session is not None:
                session, self._session = self._session, None
                await session.close()
            if self._channel is not None:
                await self._session_closed()
            if self._channel is not None:
                channel, self._channel = self._channel, None
                if self._loop is None or not self._loop.is_closed():  # else it died with its loop
                    await channel.close()

    async def _stopping(self) -> None:
        """What to do before marking the client closed (its calls still served)."""

    async def _session_closed(self) -> None:
        """What to do between closing the Session stream and closing the channel (its unary calls still served)."""

    async def _closing(self) -> None:
        """What to do between marking the client closed and closing its channel."""

    async def __aenter__(self) -> Self:
        """The client itself; leaving the ``async with`` block closes it."""
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
