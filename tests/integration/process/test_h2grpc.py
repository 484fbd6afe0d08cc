"""popgate's own HTTP/2 gRPC server against grpc's own client (grpc.aio): calls of every shape, statuses,
deadlines, cancellation, bounds and a graceful stop, over real sockets."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import grpc
import pytest

from popgate_process.bounded_threads import BoundedThreads
from popgate_process.h2grpc import H2Server, wire
from popgate_process.h2grpc.h2conn import H2Connection
from tests.integration.process.h2grpc_served import Handlers, served, started
from tests.pki import issue

pytestmark = pytest.mark.asyncio


async def refusal(call: Any, code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    """The error `call` fails with, after checking its status code."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    assert refused.value.code() == code, refused.value
    return refused.value


async def test_unary_calls_answer_with_the_callers_metadata(server: tuple[H2Server, Handlers, str]) -> None:
    _, _, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        echo = channel.unary_unary("/t.S/echo")
        assert await echo(b"hi", metadata=(("x-suffix", "!"),), timeout=5) == b"hi!"
        answers = await asyncio.gather(*(echo(str(i).encode(), timeout=5) for i in range(200)))
        assert answers == [str(i).encode() for i in range(200)]


async def test_abort_reaches_the_client_with_its_code_details_and_trailers(
    server: tuple[H2Server, Handlers, str],
) -> None:
    _, _, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        refused = await refusal(channel.unary_unary("/t.S/refuse")(b"", timeout=5), grpc.StatusCode.INVALID_ARGUMENT)
        assert refused.details() == "bad 'name' ä%"
        assert ("popgate-error", "BadRequest") in tuple(refused.trailing_metadata())


async def test_a_failing_handler_is_unknown_and_the_server_goes_on(server: tuple[H2Server, Handlers, str]) -> None:
    _, _, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        failed = await refusal(channel.unary_unary("/t.S/fail")(b"", timeout=5), grpc.StatusCode.UNKNOWN)
        assert "boom" in (failed.details() or "")
        await refusal(channel.unary_unary("/t.S/nothing")(b"", timeout=5), grpc.StatusCode.UNIMPLEMENTED)
        assert await channel.unary_unary("/t.S/echo")(b"still", timeout=5) == b"still"


async def test_a_handler_that_raises_cancelled_answers_cancelled(server: tuple[H2Server, Handlers, str]) -> None:
    """A handler whose own await was cancelled (not its call): its client is told CANCELLED at once, not left waiting
    for its deadline, and the call's place is given up."""
    h2server, _, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        await refusal(channel.unary_unary("/t.S/cancelled_within")(b"", timeout=30), grpc.StatusCode.CANCELLED)
        assert await channel.unary_unary("/t.S/echo")(b"still", timeout=5) == b"still"
    assert h2server.calls == 0


async def test_a_request_that_does_not_parse_is_unknown_as_grpc_aio_answers_it(
    server: tuple[H2Server, Handlers, str], caplog: pytest.LogCaptureFixture
) -> None:
    """As grpc.aio answers it, and not logged as a handler's failure (a client's bytes must not flood the log with
    tracebacks)."""
    _, _, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        with caplog.at_level(logging.WARNING):
            refused = await refusal(
                channel.unary_unary("/t.S/typed")(b"\xff\xff\xff", timeout=5), grpc.StatusCode.UNKNOWN
            )
        assert "DecodeError" in (refused.details() or "")
        assert await channel.unary_unary("/t.S/echo")(b"on", timeout=5) == b"on"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_request_over_the_bound_is_resource_exhausted(server: tuple[H2Server, Handlers, str]) -> None:
    _, _, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        await refusal(channel.unary_unary("/t.S/echo")(b"x" * 2000, timeout=5), grpc.StatusCode.RESOURCE_EXHAUSTED)
        assert await channel.unary_unary("/t.S/echo")(b"ok", timeout=5) == b"ok"


async def test_compressed_calls_inflate_and_a_bomb_is_refused(server: tuple[H2Server, Handlers, str]) -> None:
    """A client compressing its requests (gzip) is served, unary and streaming; a request that inflates past the
    bound (2,000 bytes, sent as a few dozen) ends its call RESOURCE_EXHAUSTED, and the connection serves on."""
    _, _, target = server
    async with grpc.aio.insecure_channel(target, compression=grpc.Compression.Gzip) as channel:
        echo = channel.unary_unary("/t.S/echo")
        assert await echo(b"a" * 900, timeout=5) == b"a" * 900
        await refusal(echo(b"x" * 2000, timeout=5), grpc.StatusCode.RESOURCE_EXHAUSTED)
        chat = channel.stream_stream("/t.S/chat")()
        await chat.write(b"b" * 900)
        assert await chat.read() == b"B" * 900
        await chat.write(b"y" * 2000)
        assert await chat.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await echo(b"ok", timeout=5) == b"ok"


class Queued(BoundedThreads):
    """One inflating place and one waiting; `queued` is set once a job waits for the place."""

    def __init__(self) -> None:
        super().__init__(threads=1, places=1, waiting=1, refused=self.busy, name="test-inflate")
        self.queued = asyncio.Event()

    @staticmethod
    def busy(why: str) -> wire.WireError:
        return wire.WireError(wire.RESOURCE_EXHAUSTED, f"busy {why}")

    async def _place(self, deadline: float | None) -> None:
        if not self._free:
            self.queued.set()
        await super()._place(deadline)


async def test_large_compressed_calls_wait_for_an_inflating_thread_and_past_the_bound_are_refused() -> None:
    """Compressed requests too large to inflate on the loop take one of the server's inflating places: with its one
    place taken, the first such call waits its turn and is served once the place is free, one past the waiting
    bound is refused RESOURCE_EXHAUSTED at once, and a small compressed call is served meanwhile (on the loop)."""
    server, _, target = await started(max_calls=16, max_receive_bytes=4 << 20)
    server.inflaters = inflaters = Queued()
    release = threading.Event()
    holding = asyncio.ensure_future(server.inflaters.run(lambda: release.wait(10)))
    big = b"b" * (1 << 20)
    try:
        async with grpc.aio.insecure_channel(target, compression=grpc.Compression.Gzip) as channel:
            echo = channel.unary_unary("/t.S/echo")
            waiting = asyncio.ensure_future(echo(big, timeout=10))
            await asyncio.wait_for(inflaters.queued.wait(), 5)  # the call has reached the server, waits its turn
            await refusal(echo(big, timeout=10), grpc.StatusCode.RESOURCE_EXHAUSTED)
            assert await echo(b"small", timeout=5) == b"small"
            assert not waiting.done()
            release.set()
            assert await waiting == big
    finally:
        release.set()
        await holding
        await server.stop(None)


async def test_a_connections_record_of_ended_calls_stays_bounded_and_goes_when_it_closes(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """A long-lived client makes every call on one connection: what the server keeps of the calls that ended is
    bounded however many there were, and is let go as soon as the connection closes."""
    h2server, _, target = server
    calls = 3000
    async with grpc.aio.insecure_channel(target) as channel:
        echo = channel.unary_unary("/t.S/echo")
        for _ in range(calls // 100):
            await asyncio.gather(*(echo(b"x", timeout=5) for _ in range(100)))
        (connection,) = h2server.connections
        assert len(connection.h2._closed_streams) <= H2Connection.MAX_CLOSED_STREAMS < calls
    await asyncio.wait_for(connection.lost, 5)
    assert not connection.h2._closed_streams and not connection.h2.streams


async def test_server_streams_arrive_whole_and_in_order(server: tuple[H2Server, Handlers, str]) -> None:
    _, _, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        got = [m async for m in channel.unary_stream("/t.S/count")(b"5000", timeout=10)]
        assert got == [str(i).encode() for i in range(5000)]


async def test_a_bidirectional_stream_reads_until_the_client_ends_its_side(
    server: tuple[H2Server, Handlers, str],
) -> None:
    _, _, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.stream_stream("/t.S/chat")()
        for word in (b"a", b"b" * 1000, b"c"):
            await call.write(word)
            assert await call.read() == word.upper()
        await call.done_writing()
        assert await call.read() == b"end"
        assert await call.code() == grpc.StatusCode.OK


async def test_requests_sent_ahead_are_read_in_order_however_many(server: tuple[H2Server, Handlers, str]) -> None:
    """A client that writes thousands of requests before reading an answer gets each answered, in order."""
    _, _, target = server
    words = [str(i).encode() + b"x" for i in range(3000)]
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.stream_stream("/t.S/chat")()

        async def write() -> None:
            for word in words:
                await call.write(word)
            await call.done_writing()

        writing = asyncio.ensure_future(write())
        answers = [await call.read() for _ in words]
        await writing
        assert answers == [word.upper() for word in words]
        assert await call.read() == b"end"


async def test_requests_a_handler_left_unread_do_not_close_the_connections_window(
    server: tuple[H2Server, Handlers, str],
) -> None:
    """Calls whose handlers read none of their requests, ~40 MB sent over one connection (about half of it arrives
    before the handlers end): its 16 MiB window must not run out."""
    _, _, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        ignore = channel.stream_unary("/t.S/ignore")
        for _ in range(16):
            calls = [ignore(iter([b"x" * 1000] * 50), timeout=10) for _ in range(50)]
            assert await asyncio.gather(*calls) == [b"ignored"] * 50
        assert await channel.unary_unary("/t.S/echo")(b"after", timeout=5) == b"after"


async def test_a_passed_deadline_answers_deadline_exceeded_and_cancels_the_handler(
    server: tuple[H2Server, Handlers, str],
) -> None:
    _, handlers, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        await refusal(channel.unary_unary("/t.S/slow")(b"", timeout=0.3), grpc.StatusCode.DEADLINE_EXCEEDED)
        await asyncio.wait_for(handlers.cancelled.wait(), 5)


async def test_a_client_that_goes_away_cancels_the_handler(server: tuple[H2Server, Handlers, str]) -> None:
    srv, handlers, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary("/t.S/slow")(b"")
        await asyncio.sleep(0.2)
        call.cancel()
        await asyncio.wait_for(handlers.cancelled.wait(), 5)
    await asyncio.sleep(0.1)
    assert srv.calls == 0


async def test_calls_beyond_the_bound_are_resource_exhausted() -> None:
    server, handlers, target = await started(max_calls=4)
    async with grpc.aio.insecure_channel(target) as channel:
        held = [channel.unary_unary("/t.S/held")(b"", timeout=10) for _ in range(4)]
        await asyncio.sleep(0.3)
        await refusal(channel.unary_unary("/t.S/echo")(b"", timeout=5), grpc.StatusCode.RESOURCE_EXHAUSTED)
        handlers.release.set()
        assert await asyncio.gather(*held) == [b"released"] * 4
        assert await channel.unary_unary("/t.S/echo")(b"again", timeout=5) == b"again"
    await server.stop(None)


async def test_a_client_that_reads_nothing_stops_the_handlers_writes(server: tuple[H2Server, Handlers, str]) -> None:
    _, handlers, target = server
    options = [("grpc.http2.lookahead_bytes", 65536), ("grpc.http2.bdp_probe", 0)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        call = channel.unary_stream("/t.S/flood")(b"")
        await call.initial_metadata()
        await asyncio.sleep(1.0)
        stalled = handlers.sent
        await asyncio.sleep(0.5)
        assert handlers.sent == stalled  # not growing: bounded by flow control and the send buffer
        assert stalled * 65536 < 8 << 20
        call.cancel()


async def test_a_graceful_stop_lets_running_calls_end() -> None:
    server, handlers, target = await started(max_calls=10)
    async with grpc.aio.insecure_channel(target) as channel:
        held = asyncio.ensure_future(channel.unary_unary("/t.S/held")(b"", timeout=10))
        await asyncio.sleep(0.3)
        stopping = asyncio.ensure_future(server.stop(5))
        await asyncio.sleep(0.3)
        handlers.release.set()
        assert await held == b"released"
        await asyncio.wait_for(stopping, 5)


async def test_tls_with_alpn_serves_grpcs_clients(tmp_path: Any) -> None:
    import ssl

    pki = issue(tmp_path, names=("popgate.test",))
    handlers = Handlers()
    server = H2Server(max_calls=10, max_receive_bytes=1024)
    server.add_generic_rpc_handlers((served(handlers),))
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(str(pki.cert), str(pki.key))
    tls.set_alpn_protocols(["h2"])
    port = await server.bind("127.0.0.1", 0, tls)
    await server.start()
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        options = [("grpc.ssl_target_name_override", "popgate.test")]
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
            assert await channel.unary_unary("/t.S/echo")(b"tls", timeout=5) == b"tls"
    finally:
        await server.stop(None)


async def test_initial_metadata_and_done_callbacks_reach_as_grpc_aio_gives_them(
    server: tuple[H2Server, Handlers, str],
) -> None:
    _, handlers, target = server
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary("/t.S/told")(b"one", timeout=5)
        assert ("x-told", "early") in tuple(await call.initial_metadata())
        assert await call == b"told"
    assert handlers.done == [b"one"]


async def test_interceptors_choose_each_calls_handler_from_its_metadata() -> None:
    from popgate_contract.broker_token import TOKEN_KEY, TokenInterceptor

    server, _, target = await started(max_calls=10, interceptors=(TokenInterceptor("s3cret"),))
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            echo = channel.unary_unary("/t.S/echo")
            assert await echo(b"in", metadata=((TOKEN_KEY, "s3cret"),), timeout=5) == b"in"
            await refusal(echo(b"out", metadata=((TOKEN_KEY, "wrong"),), timeout=5), grpc.StatusCode.UNAUTHENTICATED)
            chat = channel.stream_stream("/t.S/chat")(metadata=((TOKEN_KEY, "wrong"),))
            await refusal(chat.read(), grpc.StatusCode.UNAUTHENTICATED)
    finally:
        await server.stop(None)


class _Raising(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc has no types
    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        raise PermissionError("no token")


async def test_a_failing_interceptor_or_trailer_answers_unknown_and_frees_the_call() -> None:
    """An interceptor that raises, or trailing metadata that does not encode (a value past Latin-1): UNKNOWN at
    once, as grpc.aio answers, and the call's place among the server's calls is given back."""
    for path, interceptors in (("/t.S/echo", (_Raising(),)), ("/t.S/untrailed", ())):
        server, _, target = await started(max_calls=10, interceptors=interceptors)
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                await refusal(channel.unary_unary(path)(b"x", timeout=5), grpc.StatusCode.UNKNOWN)
                assert server.calls == 0
        finally:
            await server.stop(None)


async def test_a_request_larger_than_the_window_arrives() -> None:
    """A streaming request of 3 MiB, over a 1 MiB stream window: its bytes are acknowledged before it is whole."""
    server, _, target = await started(max_calls=10, max_receive_bytes=8 << 20)
    try:
        options = [("grpc.max_receive_message_length", 16 << 20)]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            call = channel.stream_stream("/t.S/chat")()
            await call.write(b"x" * (3 << 20))
            assert await asyncio.wait_for(call.read(), 10) == b"X" * (3 << 20)
            await call.done_writing()
            assert await call.read() == b"end"
    finally:
        await server.stop(None)


async def test_a_handler_that_reads_nothing_stops_its_client() -> None:
    """The client's writes wait once about a megabyte of its requests is unread (plus HTTP/2's windows)."""
    server, handlers, target = await started(max_calls=10, max_receive_bytes=8 << 20)
    written = [0]
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            call = channel.stream_unary("/t.S/stall")()

            async def flood() -> None:
                while True:
                    await call.write(b"x" * 65536)
                    written[0] += 1

            writer = asyncio.ensure_future(flood())
            await asyncio.sleep(1.0)
            stalled = written[0]
            await asyncio.sleep(0.5)
            assert written[0] == stalled
            assert stalled * 65536 < 8 << 20
            handlers.release.set()
            writer.cancel()
            call.cancel()
    finally:
        await server.stop(None)


async def test_streams_whose_handlers_read_nothing_leave_the_connection_serving_other_calls() -> None:
    """Streaming calls on one connection whose handlers read none of their requests, each sent as far as its
    stream's window lets it: together far more than the connection's 16 MiB window, yet a call after them is
    answered on that connection (only a stream's own window waits for its handler to read)."""
    server, handlers, target = await started(max_calls=100, max_receive_bytes=1 << 20)
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            stall = channel.stream_unary("/t.S/stall")
            calls = [stall(iter([b"r" * (256 << 10)] * 16), timeout=20) for _ in range(40)]
            await asyncio.sleep(1.5)
            assert await channel.unary_unary("/t.S/echo")(b"after", timeout=3) == b"after"
            handlers.release.set()
            assert await asyncio.gather(*calls) == [b"stalled"] * 40
    finally:
        await server.stop(None)


async def test_a_call_exempt_from_connection_age_outlives_the_grace_while_new_calls_go_to_a_new_connection() -> None:
    """A stream of `age_exempt` (the proxy's Telemetry) on a connection past its age and grace stays open both ways;
    a call of another path on that connection is still cut at the grace's end, the client's new calls go to a new
    connection, and the aged one closes once its last call ends or is cancelled."""
    server, handlers, target = await started(
        max_calls=10, max_connection_age_s=0.2, max_connection_age_grace_s=0.3, age_exempt=("/t.S/chat",)
    )
    try:
        async with grpc.aio.insecure_channel(target) as channel:
            chat, other = channel.stream_stream("/t.S/chat")(), channel.stream_stream("/t.S/chat")()
            for call in (chat, other):
                await call.write(b"a")
                assert await call.read() == b"A"
            slow = channel.unary_unary("/t.S/slow")(b"", timeout=10)
            aged = next(iter(server.connections))
            await asyncio.wait_for(handlers.cancelled.wait(), 5)  # the slow call is cut at the grace's end
            await refusal(slow, grpc.StatusCode.UNAVAILABLE)
            await asyncio.sleep(0.3)
            await chat.write(b"b")
            assert await chat.read() == b"B"
            assert await channel.unary_unary("/t.S/echo")(b"new", timeout=5) == b"new"
            assert aged in server.connections and len(aged.streams) == 2  # the chats' alone
            await chat.done_writing()
            assert await chat.read() == b"end"
            assert await chat.code() == grpc.StatusCode.OK
            other.cancel()
            await asyncio.wait_for(aged.lost, 5)  # its last call ended: the aged connection closes
    finally:
        await server.stop(None)
