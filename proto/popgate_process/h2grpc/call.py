"""One gRPC call on popgate's HTTP/2 server: what its handler sees (a grpc.aio ServicerContext's methods that
popgate's services use) and how the handler is run to a status.

A handler is a grpc.RpcMethodHandler, as the generated `add_*_to_server` functions register it: its request is
deserialized, its responses serialized (bytes pass as they are), and it ends with a status the way grpc.aio's
own server ends it — a value or stream returned is OK, `abort` is its code, another exception UNKNOWN, a client
that goes away or a deadline passed cancels it. Guarded by tests/integration/process/test_h2grpc.py.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from popgate_process.h2grpc import wire

if TYPE_CHECKING:
    from popgate_process.h2grpc.stream import Stream

log = logging.getLogger(__name__)

OK, CANCELLED, UNKNOWN, DEADLINE_EXCEEDED = 0, 1, 2, 4
Metadata = Sequence[tuple[str, str | bytes]]


class Context:
    """The handler's view of its call (grpc.aio.ServicerContext's surface that popgate's services use)."""

    def __init__(self, stream: Stream, metadata: tuple[tuple[str, str | bytes], ...], deadline: float | None) -> None:
        self._stream = stream
        self._metadata = metadata
        self._deadline = deadline
        self._loop = asyncio.get_running_loop()
        self.code: int | None = None
        self.details = ""
        self.trailing: Metadata = ()
        self.serialize: Callable[[Any], bytes] | None = None
        self._done: list[Callable[[Context], None]] = []

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - self._loop.time())

    def draining(self) -> asyncio.Event:
        """popgate's own, not grpc.aio's: set once the call's connection is told to go away (its age, a stopping
        server). A long-lived call should end soon; the client's next calls go to a new connection."""
        return self._stream.draining()

    def flushed(self) -> asyncio.Future[None] | None:
        """popgate's own: None when every response written so far is given to HTTP/2, else a future done once it is
        (the client's flow-control window took it; cancelled if the call ends first). `write` returns before that,
        once the call's unsent responses are within a bound (stream.SEND_BUFFER)."""
        return self._stream.flushed()

    def cut(self, code: int, message: str) -> None:
        """popgate's own: the call ends now with this status, its unsent responses dropped and its handler
        cancelled."""
        self._stream.cut(code, message)

    def set_trailing_metadata(self, trailing_metadata: Metadata) -> None:
        self.trailing = tuple(trailing_metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()) -> None:
        self.code, self.details = code.value[0], details
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        raise grpc.aio.AbortError()

    async def send_initial_metadata(self, initial_metadata: Metadata) -> None:
        self._stream.send_headers(wire.encode_metadata(initial_metadata))

    def add_done_callback(self, callback: Callable[[Context], None]) -> None:
        """`callback(self)` once the call has ended, however it ended."""
        self._done.append(callback)

    def ended(self) -> None:
        callbacks, self._done = self._done, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a done callback of %s failed", self._stream.path)

    async def write(self, response: Any) -> None:
        await self._stream.send(_encoded(response, self.serialize))

    async def read(self) -> Any:
        """The next request of a streaming call, or grpc.aio.EOF once the client ended its side."""
        return await self._stream.read()


def _encoded(response: Any, serialize: Callable[[Any], bytes] | None) -> bytes:
    if response.__class__ is bytes or serialize is None:
        return response  # type: ignore[no-any-return]
    return serialize(response)


async def requests(stream: Stream, deserialize: Callable[[bytes], Any] | None) -> AsyncIterator[Any]:
    """A streaming call's requests, as they arrive, until the client ends its side. Waiting for the next one, it
    keeps nothing of the last (a stream idle for a long poll's time)."""
    while (message := await stream.read_bytes()) is not None:
        request = message if deserialize is None else deserialize(message)
        del message
        yield request
        del request


async def run(
    stream: Stream, handler: grpc.RpcMethodHandler, context: Context, first: bytes | wire.Compressed | None
) -> None:
    """Run `handler` for the call and end the call with its status (not when the call was cancelled: the client
    went away, or its deadline passed and the server answered that)."""
    serialize = context.serialize = handler.response_serializer
    deserialize = handler.request_deserializer
    try:
        if handler.request_streaming:
            request: Any = requests(stream, deserialize)
        else:
            if first.__class__ is wire.Compressed:
                first = await stream.inflated(first)
            try:
                request = first if deserialize is None else deserialize(first)
            except Exception as exc:  # the client's bytes: grpc.aio's answer, not logged as a handler's failure
                log.debug("a %s request did not deserialize: %s", stream.path, exc)
                stream.finish(UNKNOWN, f"Unexpected {type(exc)}: {exc}", ())
                return
            first = None  # only the request is kept, and by the handler alone (below)
        if handler.response_streaming:
            method = handler.stream_stream if handler.request_streaming else handler.unary_stream
            result = method(request, context)
            del request  # the handler's alone: one that drops it keeps no protobuf while the call lasts (a long poll)
            if inspect.isasyncgen(result):
                try:
                    async for response in result:
                        await stream.send(_encoded(response, serialize))
                finally:
                    await result.aclose()
            elif inspect.isawaitable(result):
                await result
        else:
            method = handler.stream_unary if handler.request_streaming else handler.unary_unary
            response = await method(request, context)
            if response is not None and context.code in (None, OK):
                await stream.send(_encoded(response, serialize))
    except asyncio.CancelledError:
        if stream.finished or stream.reset:
            return  # the client went away, or the deadline's answer is sent already
        # The handler's own cancellation (an await of something cancelled), or the server stopping: the client is
        # told, and the call's place is given up —
        # test_h2grpc.py::test_a_handler_that_raises_cancelled_answers_cancelled.
        stream.finish(CANCELLED, "the call was cancelled", ())
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        return
    except grpc.aio.AbortError:
        pass
    except Exception as exc:
        log.exception("a %s handler failed", stream.path)
        context.code, context.details = UNKNOWN, f"Unexpected {type(exc)}: {exc}"
    except BaseException:
        stream.finish(UNKNOWN, "the handler stopped", ())
        raise
    try:
        stream.finish(OK if context.code is None else context.code, context.details, context.trailing)
    except (
        Exception
    ) as exc:  # trailing metadata that does not encode: UNKNOWN, as grpc.aio answers it (test_h2grpc.py::
        # test_a_failing_interceptor_or_trailer_answers_unknown_and_frees_the_call)
        log.exception("the trailing metadata of a %s call did not encode", stream.path)
        stream.finish(UNKNOWN, f"Unexpected {type(exc)}: {exc}", ())
