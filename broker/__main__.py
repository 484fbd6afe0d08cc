"""popgate-broker: wire the store, core, gRPC server, health and metrics; run until SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import sqlite3
import ssl
import sys
from contextlib import AsyncExitStack

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker import settings as settings_mod
from broker.clock import WallClock
from broker.core import BrokerCore
from broker.health import NamedHealthServicer
from broker.metrics import BrokerMetrics
from broker.server import BrokerServicer, add_to_server
from broker.settings import BrokerSettings
from broker.sqlite_store import SqliteStore
from popgate_contract.broker_token import TokenInterceptor
from popgate_contract.errors import StoreUnavailable
from popgate_process import certs, event_loop
from popgate_process.collector import collect_less_often
from popgate_process.config import cannot_listen
from popgate_process.logs import configure_logging
from popgate_process.memory import MemoryTrimmer
from popgate_process.metrics_http import export_metrics, serve_metrics
from popgate_process.stop_signals import StopSignals

log = logging.getLogger("broker")


async def sweep_forever(core: BrokerCore, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        core.sweep()


async def watch_store(store: SqliteStore, health_servicer: NamedHealthServicer, interval_s: float) -> None:
    """Once the store's files are no longer those it opened (its data directory deleted or replaced: it refuses
    writes from then on), health answers NOT_SERVING — tests/integration/broker/test_data_dir_gone.py."""
    while True:
        await asyncio.sleep(interval_s)
        if store.files_moved() is not None:
            break
    for name in SERVICES:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)


SERVICES = ("", "popgate.broker.v1.Broker")  # the names health answers for


class StartError(Exception):
    """A start-up failure the operator fixes with a flag (a port in use, a directory that is a file): one line."""


async def _open(settings: BrokerSettings, metrics: BrokerMetrics) -> SqliteStore:
    """The store, opened off the event loop (a layout migration takes minutes)."""
    opening = functools.partial(
        SqliteStore, settings.data_dir, flush=settings.flush, on_commit=metrics.commit_duration.observe
    )
    try:
        return await asyncio.get_running_loop().run_in_executor(None, opening)
    except OSError as exc:  # not a directory, no permission, a read-only file system
        raise StartError(f"--data-dir {settings.data_dir}: {exc.strerror or exc}") from None
    except sqlite3.Error as exc:  # not a database, damaged, or the disk full (a new store's tables not written)
        raise StartError(f"--data-dir {settings.data_dir}: the store cannot be opened ({exc})") from None


async def _open_store(
    settings: BrokerSettings, metrics: BrokerMetrics, stack: AsyncExitStack, stop: asyncio.Event
) -> BrokerCore | None:
    """The store, loaded and started, and the core restored from it: both closed by `stack` (core first). Opened
    and loaded off the event loop (a layout migration or a large load takes minutes): /livez and /metrics answer
    meanwhile — tests/integration/broker/test_start.py::test_livez_and_metrics_answer_while_the_store_opens.
    None when `stop` is set before the open, the load or the restore: the next step is not begun —
    tests/integration/process/test_signals.py::test_a_stop_while_the_store_opens_ends_the_start_before_the_load."""
    loop = asyncio.get_running_loop()
    if stop.is_set():
        return None
    store = await _open(settings, metrics)
    stack.push_async_callback(store.close)
    if stop.is_set():
        return None
    try:
        snapshot = await loop.run_in_executor(None, store.load)
    except sqlite3.Error as exc:  # damaged pages (a damaged row: StoreUnavailable, naming it)
        raise StartError(f"--data-dir {settings.data_dir}: the store cannot be read ({exc})") from None
    if stop.is_set():
        return None
    core = BrokerCore(settings, store, clock=WallClock())
    stack.push_async_callback(core.close)
    store.set_listener(core)
    store.start(loop)
    core.restore(snapshot)
    created = await core.create_topics(settings.topics)
    if created:
        log.info("created topics %s", ", ".join(created))
    core.start()
    return core


UNARY_CALLS = 1024  # calls beyond the held long polls the gRPC server takes at once (Session streams included)


def _grpc_server(
    settings: BrokerSettings, servicer: BrokerServicer
) -> tuple[grpc.aio.Server, int, certs.ServingCredentials | None]:
    """The gRPC server with the broker's and the health services, bound to --listen (not started): its port, and
    its certificate's holder when it serves TLS."""
    limit = settings.max_grpc_message_bytes
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
            ("grpc.max_concurrent_streams", 1 << 20),
            ("grpc.server.max_pending_requests", 1 << 20),
            ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
        ],
        interceptors=[TokenInterceptor(settings.broker_token)] if settings.broker_token else None,
        # Held unary Pops and Notifications are calls; a call whose request never comes is held by grpc, with
        # its buffers, without reaching a handler: beyond this many, RESOURCE_EXHAUSTED before any handler.
        maximum_concurrent_rpcs=settings.max_held + UNARY_CALLS,
    )
    add_to_server(servicer, server)
    if not settings.listen.endswith(":0") and (why := cannot_listen(settings.listen)) is not None:
        raise StartError(f"--listen {settings.listen}: cannot listen there ({why})")
    tls = None
    if settings.tls_cert:
        try:
            tls = certs.ServingCredentials(certs.load(settings.tls_cert, settings.tls_key))
        except (OSError, ssl.SSLError, certs.Changed) as exc:
            raise StartError(f"--tls-cert {settings.tls_cert} and --tls-key {settings.tls_key}: {exc}") from None
    try:
        if tls is not None:
            port = server.add_secure_port(settings.listen, tls.credentials)
        else:
            port = server.add_insecure_port(settings.listen)
    except RuntimeError as exc:  # grpc's "Failed to bind": the port is in use or the address is not local
        raise StartError(f"--listen {settings.listen}: cannot listen there ({exc})") from None
    return server, port, tls


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def serve(settings: BrokerSettings, signals: StopSignals | None = None) -> None:
    """Serve until a stop signal (popgate_process.stop_signals), then shut down gracefully (held requests answered).
    Whatever a start-up failure finds open (store, core, metrics) is closed on the way out, as at the end."""
    loop = asyncio.get_running_loop()
    stop = (signals or StopSignals()).attach(loop)
    metrics = BrokerMetrics()
    async with AsyncExitStack() as stack:
        async with AsyncExitStack() as served:
            # /metrics answers while the store is read (minutes for a large one): a scrape finds the broker up and
            # starting, not down (test_start.py::test_metrics_are_served_while_the_store_is_read). Once the core is
            # open, closed before it (the stack unwinds in reverse).
            await serve_metrics(served, metrics.registry, settings, error=StartError)
            core = await _open_store(settings, metrics, stack, stop)
            stack.push_async_callback(served.pop_all().aclose)
        if core is None or stop.is_set():  # a stop during start-up ends it here, the store closed: exit 0, not serving
            log.info("stopped before serving")  # test_signals.py::test_a_stop_while_the_store_is_read_ends_the_start
            return
        metrics.watch(core)
        # Before the gRPC server starts: a failure here has nothing serving to stop yet. Closed after it stops
        # (the stack unwinds in reverse): the last snapshot comes after the last RPC.
        await export_metrics(stack, metrics.registry, settings, kind="broker", process=settings.name, error=StartError)
        servicer = BrokerServicer(core, metrics)
        server, port, tls = _grpc_server(settings, servicer)
        if tls is not None:
            watch = certs.CertificateWatch(
                settings.tls_cert, settings.tls_key, tls, interval_s=settings.tls_reload_s, metrics=metrics.tls
            )
            await stack.enter_async_context(watch)
        health_servicer = NamedHealthServicer(settings.name)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        await server.start()
        stack.enter_context(MemoryTrimmer())
        sweeper = loop.create_task(sweep_forever(core, settings.sweep_interval_s))
        stack.push_async_callback(_cancel, sweeper)  # once the server has stopped
        retention = loop.create_task(core.retention.run_forever())
        stack.push_async_callback(_cancel, retention)
        stack.push_async_callback(server.stop, None)  # a failure below must not leave it serving (no-op later)
        for name in SERVICES:
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        if isinstance(core.store, SqliteStore):
            watcher = loop.create_task(watch_store(core.store, health_servicer, settings.sweep_interval_s))
            stack.push_async_callback(_cancel, watcher)

        host = settings.listen.rpartition(":")[0]
        print(f"ready {host}:{port}", file=sys.stderr, flush=True)
        log.info("broker %s serving on %s:%s, data in %s", settings.name, host, port, settings.data_dir)
        await stop.wait()

        log.info("stopping: answering held requests")
        await health_servicer.enter_graceful_shutdown()
        core.hold.close()
        servicer.stopping.set()
        await server.stop(settings.shutdown_grace_s)
    log.info("stopped")


def main(argv: list[str] | None = None) -> None:
    signals = StopSignals().install()  # before anything slow: a stop signal is never lost nor kills it unstopped
    settings = settings_mod.parse(argv)
    # Past a file-size limit (RLIMIT_FSIZE) the kernel sends SIGXFSZ, whose default action kills the process.
    # A daemon should get EFBIG instead: SQLite then fails the commit and the broker refuses writes, still serving.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    configure_logging(settings.log_level, settings.log_format)  # --log-level, --log-format text|json
    collect_less_often()
    try:
        event_loop.run(serve(settings, signals))
    except (StoreUnavailable, StartError) as exc:  # data directory in use or unusable, a port taken, ...
        log.error("cannot start: %s", exc)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
