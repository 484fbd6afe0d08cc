"""Wire the proxy's object graph and run it until stopped: brokers, health, core, gRPC, metrics."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from contextlib import AsyncExitStack

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from popgate_pb.ext import admin_pb2_grpc
from popgate_pb.ext import messaging_pb2_grpc as ext_grpc
from popgate_pb.v2 import service_pb2_grpc

from popgate_contract.errors import Unauthorized
from popgate_contract.validation import parse_host_port
from popgate_process import certs
from popgate_process.config import cannot_listen
from popgate_process.export import default_proxy_name
from popgate_process.h2grpc import H2Server
from popgate_process.h2grpc.server import Metadata
from popgate_process.memory import MemoryTrimmer
from popgate_process.metrics_http import export_metrics, serve_metrics
from proxy.admin import AdminService
from proxy.auth import REFUSED_KEY, Authenticator, Refusal
from proxy.broker_clients import BrokerClients, discovery_for
from proxy.consumers import ConsumerReporter
from proxy.core import Proxy
from proxy.discovery import Discovery
from proxy.health import HealthMonitor
from proxy.metrics import ProxyMetrics
from proxy.ports import Metrics
from proxy.receive.modes import make_strategy
from proxy.renewal import Renewer
from proxy.renewal_book import RenewalLimits, renewal_period_s
from proxy.routing import BrokerPool
from proxy.settings import Settings, SettingsError
from proxy.v2 import access
from proxy.v2.context import endpoints_for
from proxy.v2.service import ExtMessaging, MessagingService

log = logging.getLogger(__name__)
SERVICE_NAME = "apache.rocketmq.v2.MessagingService"


UNARY_CALLS = 1024  # calls beyond the held receives and Telemetry streams the gRPC server takes at once


def max_calls(settings: Settings) -> int:
    """Calls the gRPC server takes at once; beyond, grpc answers RESOURCE_EXHAUSTED before any handler.

    The handlers' own bounds (max_held_receives, max_telemetry_streams) count calls a handler runs; a call
    whose request message never comes never reaches one, yet grpc holds memory for it. This bound holds those
    too — tests/integration/proxy/test_call_bound.py."""
    return settings.max_held_receives + settings.max_telemetry_streams + UNARY_CALLS


class PassBytes:
    """The grpc server as the generated ``add_*_to_server`` functions see it: every method they register writes a
    ``bytes`` response as it is and serializes any other, so a handler may hand grpc frames it encoded itself (the
    receive byte path) beside message objects — tests/unit/proxy/test_splice.py::
    test_registered_methods_write_bytes_as_they_are_and_serialize_objects."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_PassingHandler(h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server.add_registered_method_handlers(service, {name: _passing(h) for name, h in handlers.items()})


def _passing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    serialize = handler.response_serializer
    if serialize is None:
        return handler

    def serializer(response: object) -> bytes:
        return response if response.__class__ is bytes else serialize(response)

    return handler._replace(response_serializer=serializer)


class _PassingHandler(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc has no types
    def __init__(self, inner: grpc.GenericRpcHandler) -> None:
        self._inner = inner
        self._methods: dict[str, grpc.RpcMethodHandler] = {}  # the inner's handlers, passing (one per method)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = details.method
        handler = self._methods.get(method)
        if handler is None:
            inner = self._inner.service(details)
            if inner is None:
                return None
            handler = self._methods[method] = _passing(inner)
        return handler


def _certificate(settings: Settings) -> certs.Loaded:
    try:
        return certs.load(settings.tls_cert, settings.tls_key, alpn=("h2",))
    except (OSError, ssl.SSLError, certs.Changed) as exc:
        raise SettingsError(f"--tls-cert {settings.tls_cert} and --tls-key {settings.tls_key}: {exc}") from None


# A client holds one Telemetry stream for as long as it runs, and the official clients open another only when a write
# on it fails (every 300 s): an aged connection keeps it open, so transaction checks still reach the producer, while
# the client's new calls go to a new connection (tests/integration/proxy/test_connection_age.py).
TELEMETRY = "/apache.rocketmq.v2.MessagingService/Telemetry"


# The services whose every call needs credentials when the proxy has accounts (gRPC health needs none), and the
# one call whose refusal echoes its request (ChangeInvisibleDuration's receipt handle: MessagingService).
CREDENTIALED = ("/apache.rocketmq.v2.MessagingService/", "/popgate.ext.v1.Messaging/", "/popgate.admin.v1.Admin/")
ECHOING = "/apache.rocketmq.v2.MessagingService/ChangeInvisibleDuration"


def _unverified(auth: Authenticator) -> Callable[[str, Metadata], Metadata | None] | None:
    """For a call whose credentials do not verify, checked at its headers, the metadata its handler is to see: the
    call's own and why it is refused, which the handler's check (`Authenticator.authenticate`) refuses with before
    reading the request (40100, or UNAUTHENTICATED) whatever the clock says by then, so the server answers it
    without waiting for the request — tests/integration/proxy/test_client_accounts.py::
    test_a_call_without_credentials_is_refused_before_its_request_is_whole. None (nothing checked) without accounts."""
    if not auth.enabled:
        return None

    def unverified(path: str, metadata: Metadata) -> Metadata | None:
        if not path.startswith(CREDENTIALED) or path == ECHOING:
            return None
        try:
            auth.authenticate(access.metadata_of(metadata))
        except Unauthorized as exc:
            return (*metadata, (REFUSED_KEY, Refusal(exc.message)))
        except Exception:  # anything else is the handler's to answer, as it would without this check
            return None
        return None

    return unverified


async def _h2_server(settings: Settings) -> tuple[H2Server, str, certs.Serving | None]:
    """popgate's own server (docs/PROXY.md "Server"), bound to --listen (not started): its address, and its
    certificate's holder when it serves TLS."""
    server = H2Server(
        max_calls=max_calls(settings),
        max_receive_bytes=settings.max_message_bytes,
        max_connection_age_s=settings.max_connection_age_s,
        max_connection_age_grace_s=settings.max_connection_age_grace_s,
        age_exempt=(TELEMETRY,),
    )
    host, port = parse_host_port(settings.listen, what="--listen")
    tls = certs.ServingContext(_certificate(settings)) if settings.tls_cert else None
    try:
        port = await server.bind(host, port, tls.context if tls is not None else None)
    except OSError as exc:
        raise SettingsError(f"--listen {settings.listen}: cannot listen there ({exc.strerror})") from None
    return server, f"{settings.listen.rpartition(':')[0]}:{port}", tls


def _grpc_server(settings: Settings) -> tuple[grpc.aio.Server, str, certs.Serving | None]:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", settings.max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.so_reuseport", 0),  # a stale proxy on the same port must not share traffic
            # Held receives are server-streaming calls: grpc core's defaults (1,000 pending requests, 100
            # streams per connection) cancel a burst of idle receives; `max_calls` is the bound.
            ("grpc.server.max_pending_requests", 1 << 20),
            ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
            ("grpc.max_concurrent_streams", 1 << 20),
            *_age_options(settings),
        ],
        maximum_concurrent_rpcs=max_calls(settings),
    )
    if not settings.listen.endswith(":0") and (why := cannot_listen(settings.listen)) is not None:
        raise SettingsError(f"--listen {settings.listen}: cannot listen there ({why})")
    tls = certs.ServingCredentials(_certificate(settings)) if settings.tls_cert else None
    try:
        if tls is not None:
            port = server.add_secure_port(settings.listen, tls.credentials)
        else:
            port = server.add_insecure_port(settings.listen)
    except RuntimeError as exc:  # grpc's "Failed to bind": port in use or address not local
        raise SettingsError(f"--listen {settings.listen}: cannot listen there ({exc})") from None
    return server, f"{settings.listen.rpartition(':')[0]}:{port}", tls


def _age_options(settings: Settings) -> list[tuple[str, int]]:
    """grpc-core's own maximum connection age, as `H2Server`'s (off when 0)."""
    if settings.max_connection_age_s <= 0:
        return []
    return [
        ("grpc.max_connection_age_ms", int(settings.max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(settings.max_connection_age_grace_s * 1000)),
    ]


def proxy_name(address: str) -> str:
    """How this proxy names itself in its consumer reports (a report replaces the last one of the same name): the
    host's name and the port it listens on, one per process — not its advertised address, which every replica
    behind one Service shares (tests/integration/proxy/test_admin_ops.py::
    test_a_groups_live_consumers_are_the_same_from_any_proxy)."""
    return f"{socket.gethostname()}:{address.rpartition(':')[2]}"


def renewer_for(settings: Settings, pool: BrokerPool, metrics: Metrics | None = None) -> Renewer:
    """Renewal of auto_renew receives: every quarter of their invisible time, to another whole one."""
    limits = RenewalLimits(
        period_s=renewal_period_s(settings.default_invisible_s),
        max_renew_s=settings.renew_max_s,
        max_per_client=settings.renew_max_per_client,
        max_total=settings.renew_max_handles,
    )
    invisible_ms = int(settings.default_invisible_s * 1000)
    return Renewer(pool, limits, invisible_ms=invisible_ms, broker_timeout_s=settings.broker_timeout_s, metrics=metrics)


async def _serving(
    health_servicer: health.aio.HealthServicer,
    discovery: Discovery | None,
    brokers: BrokerClients,
    stack: AsyncExitStack,
    *,
    first_check_s: float,
) -> None:
    """Health SERVING at once with a static broker list; under discovery once a lookup has answered and one of the
    brokers it found passed a health check (at most `first_check_s` after the answer): before, the proxy routes to no
    broker and would refuse what a client sends it (a readiness probe keeps clients away) —
    tests/integration/proxy/test_discovery.py::test_a_proxy_is_ready_only_once_its_first_lookup_has_answered."""

    async def serving() -> None:
        if discovery is not None:
            await discovery.answered.wait()
            found = [client.when_up() for client in brokers.current.values()]
            if found:
                # not cancelled after: each client's up-future is shared by whoever waits for it
                await asyncio.wait(found, timeout=first_check_s, return_when=asyncio.FIRST_COMPLETED)
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    if discovery is None or discovery.answered.is_set():
        await serving()
        return
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    log.warning("broker discovery: no lookup answered yet; health NOT_SERVING until one does")
    task = asyncio.create_task(serving(), name="serving-once-found")
    stack.callback(task.cancel)


def _proxy(settings: Settings, pool: BrokerPool, metrics: ProxyMetrics) -> Proxy:
    return Proxy(
        pool,
        make_strategy(settings, pool, metrics),
        queues_per_broker=settings.queues_per_broker,
        broker_timeout_s=settings.broker_timeout_s,
        max_held_receives=settings.max_held_receives,
        max_answer_bytes=settings.max_answer_bytes,
        max_send_bytes=settings.max_send_bytes,
        send_chunk_bytes=settings.send_chunk_bytes,
        metrics=metrics,
        renewer=renewer_for(settings, pool, metrics),
    )


async def _brokers(
    settings: Settings, metrics: ProxyMetrics, stack: AsyncExitStack
) -> tuple[BrokerClients, Discovery | None]:
    """The broker clients with their trust watch, health monitor and discovery, each closed by `stack`."""
    brokers = BrokerClients(settings, metrics)
    stack.push_async_callback(brokers.close)
    if brokers.tls_ca is not None:
        trust = certs.TrustWatch(
            settings.broker_tls_ca,
            brokers.tls_ca,
            brokers.trust,
            interval_s=settings.tls_reload_s,
            metrics=metrics.tls,
        )
        await stack.enter_async_context(trust)
    monitor = HealthMonitor(
        lambda: brokers.current.values(),
        interval=settings.health_interval_s,
        timeout=settings.health_timeout_s,
        reconnect=brokers.reconnect,
    )
    brokers.added = monitor.check_now
    discovery = await discovery_for(settings, brokers, stack)
    await stack.enter_async_context(monitor)
    metrics.watch_brokers(lambda: [(view.name, view.up) for view in brokers.views()])
    return brokers, discovery


async def _listening(
    settings: Settings, metrics: ProxyMetrics, stack: AsyncExitStack
) -> tuple[grpc.aio.Server | H2Server, str]:
    """The server bound to --listen (not started), with its certificate's watch when it serves TLS; its address."""
    server: grpc.aio.Server | H2Server
    server, address, tls = await _h2_server(settings) if settings.server == "h2" else _grpc_server(settings)
    if tls is not None:
        watch = certs.CertificateWatch(
            settings.tls_cert,
            settings.tls_key,
            tls,
            interval_s=settings.tls_reload_s,
            alpn=("h2",),
            metrics=metrics.tls,
        )
        await stack.enter_async_context(watch)
    return server, address


def _add_services(
    settings: Settings,
    server: grpc.aio.Server | H2Server,
    proxy: Proxy,
    brokers: BrokerClients,
    metrics: ProxyMetrics,
    address: str,
    stack: AsyncExitStack,
) -> health.aio.HealthServicer:
    """v2, the extension (with --batch-receive), admin and health on `server`; the health servicer."""
    servicer = MessagingService(proxy, settings, endpoints_for(settings.advertise or address), metrics)
    stack.push_async_callback(servicer.close)
    # Receive frames may be pre-encoded (proxy/v2/receive.py's byte path): h2grpc writes bytes as they are.
    passing = server if isinstance(server, H2Server) else PassBytes(server)
    service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, passing)  # type: ignore[no-untyped-call]
    if settings.batch_receive:
        ext_grpc.add_MessagingServicer_to_server(ExtMessaging(servicer), passing)  # type: ignore[no-untyped-call]
    if isinstance(server, H2Server):  # one Authenticator: a call verified at its headers is not verified again
        server.unheard = _unverified(servicer.auth)
    admin = AdminService(
        brokers.pool,
        brokers.views,
        servicer.auth,
        timeout_s=settings.broker_timeout_s,
        deleted=proxy.deleted,
    )
    admin_pb2_grpc.add_AdminServicer_to_server(admin, server)  # type: ignore[no-untyped-call]
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    return health_servicer


def _warn_if_open(settings: Settings) -> None:
    """Serving without accounts, or with them over plaintext, is said at start — tests/integration/sdk/test_up.py::
    test_the_environment_reaches_the_children_and_one_config_file_serves_them_all."""
    if not settings.accounts:
        log.warning("authentication is off: no [[acl]] accounts, every request is served without credentials")
    elif not settings.tls_cert:
        log.warning("authentication is on over plaintext: signed headers can be replayed while fresh; use TLS")


async def serve(settings: Settings, stop: asyncio.Event, ready: Callable[[str], None]) -> None:
    """Serve until `stop` is set, then shut down gracefully (held receives answered)."""
    async with AsyncExitStack() as stack:
        metrics = ProxyMetrics()
        brokers, discovery = await _brokers(settings, metrics, stack)
        proxy = _proxy(settings, brokers.pool, metrics)
        brokers.came_up = proxy.broker_up
        stack.callback(proxy.close)  # announcements under way end with the proxy (a no-op after its graceful stop)
        await stack.enter_async_context(proxy.renewer)
        server, address = await _listening(settings, metrics, stack)
        name = proxy_name(address)
        reporter = ConsumerReporter(proxy.consumers, brokers.pool, name, timeout_s=settings.broker_timeout_s)
        await stack.enter_async_context(reporter)
        proxy.renewer.elsewhere = reporter.reported_elsewhere  # a client that moved to another proxy stays renewed
        health_servicer = _add_services(settings, server, proxy, brokers, metrics, address, stack)
        first_check_s = settings.health_timeout_s + settings.health_interval_s  # a found broker's first check
        await _serving(health_servicer, discovery, brokers, stack, first_check_s=first_check_s)
        if stop.is_set():  # a stop during start-up ends it here, closed as at the end: exit 0, never serving
            log.info("stopped before serving")  # test_signals.py::test_a_stop_while_the_proxy_starts_ends_the_start
            return
        await server.start()
        stack.push_async_callback(server.stop, None)  # a failure below must not leave it serving (no-op later)
        stack.enter_context(MemoryTrimmer())
        process = default_proxy_name(int(address.rpartition(":")[2]))
        await serve_metrics(stack, metrics.registry, settings, error=SettingsError)
        await export_metrics(stack, metrics.registry, settings, kind="proxy", process=process, error=SettingsError)
        _warn_if_open(settings)
        ready(address)
        log.info(
            "proxy serving on %s (receive mode %s), brokers %s",
            address,
            settings.receive_mode,
            ", ".join(f"{c.name}={c.address.target}" for c in brokers.current.values()) or "(none found yet)",
        )
        await stop.wait()
        log.info("stopping: answering held receives")
        await health_servicer.enter_graceful_shutdown()
        proxy.close()
        await server.stop(settings.shutdown_grace_s)
