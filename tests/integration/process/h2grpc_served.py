"""The handlers popgate's gRPC server is tested with (tests/integration/process/test_h2grpc*.py), and a server of
them on a free port."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import wrappers_pb2

from popgate_process.h2grpc import H2Server


class Handlers:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.sent = 0
        self.release = asyncio.Event()
        self.done: list[bytes] = []
        self.flushed = asyncio.Event()

    async def echo(self, request: bytes, context: Any) -> bytes:
        metadata = dict(context.invocation_metadata())
        return request + metadata.get("x-suffix", "").encode()

    async def sized(self, request: bytes, context: Any) -> bytes:
        """An answer of `request` (a number) bytes."""
        return b"s" * int(request)

    async def untrailed(self, request: bytes, context: Any) -> bytes:
        context.set_trailing_metadata((("x-topic", "\u8ba2\u5355"),))  # not Latin-1: it does not encode
        return b"ok"

    async def told(self, request: bytes, context: Any) -> bytes:
        await context.send_initial_metadata((("x-told", "early"),))
        context.add_done_callback(lambda _: self.done.append(request))
        return b"told"

    async def refuse(self, request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad 'name' ä%", (("popgate-error", "BadRequest"),))
        raise AssertionError("abort returns not")

    async def fail(self, request: bytes, context: Any) -> bytes:
        raise ValueError("boom")

    async def slow(self, request: bytes, context: Any) -> bytes:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b""

    async def cancelled_within(self, request: bytes, context: Any) -> bytes:
        """Raises CancelledError of its own (it awaits a future someone cancelled): its task was not cancelled."""
        gone = asyncio.get_running_loop().create_future()
        gone.cancel()
        return await gone

    async def held(self, request: bytes, context: Any) -> bytes:
        await self.release.wait()
        return b"released"

    async def count(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            yield str(i).encode()

    async def flood(self, request: bytes, context: Any) -> None:
        while True:  # the client reads none: `write` must stop taking them
            await context.write(b"x" * 65536)
            self.sent += 1

    async def small(self, request: bytes, context: Any) -> None:
        """`request` frames of 30 KB, then waits until the client's window took them all."""
        for _ in range(int(request)):
            await context.write(b"y" * 30_000)
        taken = context.flushed()
        if taken is not None:
            await taken
        self.flushed.set()

    async def ignore(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        await asyncio.sleep(0.05)  # the requests arrive meanwhile, and are never read
        return b"ignored"

    async def stall(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        await self.release.wait()  # reads none of its requests
        return b"stalled"

    async def chat(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request.upper()
        yield b"end"


def served(handlers: Handlers) -> grpc.GenericRpcHandler:
    names = ("echo", "sized", "untrailed", "told", "refuse", "fail", "slow", "held", "cancelled_within")
    unary = {name: grpc.unary_unary_rpc_method_handler(getattr(handlers, name)) for name in names}
    return grpc.method_handlers_generic_handler(
        "t.S",
        {
            **unary,
            "typed": grpc.unary_unary_rpc_method_handler(
                handlers.echo, request_deserializer=wrappers_pb2.BytesValue.FromString
            ),
            "count": grpc.unary_stream_rpc_method_handler(handlers.count),
            "flood": grpc.unary_stream_rpc_method_handler(handlers.flood),
            "small": grpc.unary_stream_rpc_method_handler(handlers.small),
            "chat": grpc.stream_stream_rpc_method_handler(handlers.chat),
            "ignore": grpc.stream_unary_rpc_method_handler(handlers.ignore),
            "stall": grpc.stream_unary_rpc_method_handler(handlers.stall),
        },
    )


async def started(
    max_calls: int, interceptors: tuple[Any, ...] = (), max_receive_bytes: int = 1024, **options: Any
) -> tuple[H2Server, Handlers, str]:
    """A server of `Handlers` on a free port; `options`: H2Server's keepalive and connection-age settings."""
    handlers = Handlers()
    server = H2Server(max_calls=max_calls, max_receive_bytes=max_receive_bytes, interceptors=interceptors, **options)
    server.add_generic_rpc_handlers((served(handlers),))
    port = await server.bind("127.0.0.1", 0)
    await server.start()
    return server, handlers, f"127.0.0.1:{port}"
