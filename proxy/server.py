"""Wire the proxy's object graph and run it until stopped: brokers, health, core, gRPC, metrics."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from popgate_pb.ext import admin_pb2_grpc
from popgate_pb.ext import messaging_pb2_grpc as ext_grpc
from popgate_pb.v2 import service_pb2_grpc

from popgate_contract.validation import parse_host_port
from popgate_process import certs
from popgate_process.config import cannot_listen
from popgate_process.export import default_proxy_name
from popgate_process.h2grpc import H2Server
from popgate_process.memory import MemoryTrimmer
from popgate_process.metrics_http import export_metrics, serve_metrics
from proxy.admin import AdminService, BrokerView
from proxy.auth import Authenticator
from proxy.brokers import GrpcBrokerClient
from proxy.consumers import ConsumerReporter
from proxy.core import Proxy
from proxy.discovery import Discovery, PoolEdits, SrvLookup
from proxy.health import HealthMonitor
from proxy.metrics import ProxyMetrics
from proxy.ports import Metrics
from proxy.receive.modes import make_strategy
from proxy.renewal import Renewer
from proxy.renewal_book import RenewalLimits, renewal_period_s
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings, SettingsError
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


def _broker_ca(settings: Settings) -> bytes:
    try:
        return certs.trusted(Path(settings.broker_tls_ca).read_bytes())
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(f"--broker-tls-ca {settings.broker_tls_ca}: {exc}") from None


def _certificate(settings: Settings) -> certs.Loaded:
    try:
        return certs.load(settings.tls_cert, settings.tls_key, alpn=("h2",))
    except (OSError, ssl.SSLError, certs.Changed) as exc:
        raise SettingsError(f"--tls-cert {settings.tls_cert} and --tls-key {settings.tls_key}: {exc}") from None


# A client holds one Telemetry stream for as long as it runs, and the official clients open another only when a write
# on it fails (every 300 s): an aged connection keeps it open, so transaction checks still reach the producer, while
# the client's new calls go to a new connection (tests/integration/proxy/test_connection_age.py).
TELEMETRY = "/apache.rocketmq.v2.MessagingService/Telemetry"


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


class BrokerClients:
    """The proxy's broker clients by name — the listed brokers, or those discovery finds — and every client it
    made, closed when the proxy stops. A client discovery replaced (its broker moved) or retired is closed once the
    calls it had could have ended (`replaced_grace_s`); a retired one stays in the pool, down and closed, so handles
    naming it resolve and are answered as a down broker's — tests/unit/proxy/test_discovery.py::
    test_a_retired_client_is_closed_after_its_grace_and_its_handles_are_still_answered_as_down."""

    def __init__(self, settings: Settings, metrics: ProxyMetrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self.tls_ca = _broker_ca(settings) if settings.broker_tls_ca else None
        self.current: dict[str, GrpcBrokerClient] = {}
        self._made: set[GrpcBrokerClient] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self.replaced_grace_s = settings.broker_timeout_s + settings.max_long_polling_s
        self.added: Callable[[GrpcBrokerClient], None] | None = None  # told of each client `add` made down
        # Told each time a broker comes up (added, moved, back from down): the proxy announces its groups there.
        self.came_up: Callable[[GrpcBrokerClient], None] | None = None
        self.pool = BrokerPool({})
        for address in settings.brokers:
            self.add(address, up=True)  # listed: checked before the proxy serves

    def add(self, address: BrokerAddress, why: str = "gone from broker discovery", *, up: bool = False) -> None:
        """A client for `address` in place of its name's. Down (out of routing) until a health check passes, which
        `added` runs at once, unless `up` — tests/unit/proxy/test_discovery.py::
        test_a_broker_discovery_adds_is_routed_only_once_a_health_check_passed_which_runs_at_once."""
        settings = self._settings
        client = GrpcBrokerClient(
            address, metrics=self._metrics, token=settings.broker_token, tls_ca=self.tls_ca, up=up
        )
        client.on_up = self._came_up
        if not up and self.added is not None:
            self.added(client)
        self._made.add(client)
        self.current[address.name] = client
        replaced = self.pool.put(client)
        if isinstance(replaced, GrpcBrokerClient):
            replaced.retire(why)  # its calls fail over to the new client
            asyncio.get_running_loop().call_later(self.replaced_grace_s, self._close, replaced)

    def _came_up(self, client: GrpcBrokerClient) -> None:
        if self.came_up is not None:
            self.came_up(client)

    def trust(self, ca: bytes) -> None:
        """Verify brokers against `ca` from now on: every broker's client is made again with it (new connections), and
        the one before ends as when discovery moves a broker."""
        self.tls_ca = ca
        for client in list(self.current.values()):
            self.add(client.address, why="replaced: the broker CA bundle changed", up=client.healthy)

    def reconnect(self, client: GrpcBrokerClient) -> None:
        """A new client (a new connection) for `client`'s broker, its health checks timing out on a connection that
        may have died without a word; the one before ends as when discovery moves a broker —
        tests/integration/proxy/test_silent_link.py."""
        if self.current.get(client.name) is client:
            log.warning(
                "broker %s (%s): health checks time out on its connection: connecting again",
                client.name,
                client.address.target,
            )
            self.add(client.address, why="replaced: its connection stopped answering", up=False)
            self.current[client.name].connect()

    def _close(self, client: GrpcBrokerClient) -> None:
        if client in self._made:
            self._made.discard(client)
            task = asyncio.get_running_loop().create_task(client.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def retire(self, name: str) -> None:
        self.pool.retire(name)
        client = self.current.pop(name, None)
        if client is not None:
            client.retire()
            asyncio.get_running_loop().call_later(self.replaced_grace_s, self._close, client)

    def views(self) -> list[BrokerView]:
        return [BrokerView(n, c.address.target, c.healthy) for n, c in sorted(self.current.items())]

    async def close(self) -> None:
        await asyncio.gather(*self._closing, *(client.close() for client in self._made), return_exceptions=True)


async def _discovery(settings: Settings, brokers: BrokerClients, stack: AsyncExitStack) -> Discovery | None:
    if not settings.broker_srv:
        return None
    lookup = SrvLookup(settings.broker_srv, server=settings.broker_dns_server, timeout_s=settings.health_timeout_s * 4)
    edits = PoolEdits(add=brokers.add, retire=brokers.retire)
    interval, forget = settings.broker_dns_interval_s, settings.broker_forget_s
    discovery = Discovery(lookup, edits, interval_s=interval, forget_s=forget)
    brokers.pool.unknown_broker = discovery.ask  # a handle naming a broker not found yet: retriable, looked up now
    return await stack.enter_async_context(discovery)


async def _serving(
    health_servicer: health.aio.HealthServicer, discovery: Discovery | None, stack: AsyncExitStack
) -> None:
    """Health SERVING at once with a static broker list; under discovery once a lookup has answered: before, the
    proxy knows no broker and would refuse what a client sends it (a readiness probe keeps clients away) —
    tests/integration/proxy/test_discovery.py::test_a_proxy_is_ready_only_once_its_first_lookup_has_answered."""

    async def serving() -> None:
        if discovery is not None:
            await discovery.answered.wait()
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


async def serve(settings: Settings, stop: asyncio.Event, ready: Callable[[str], None]) -> None:
    """Serve until `stop` is set, then shut down gracefully (held receives answered)."""
    async with AsyncExitStack() as stack:
        metrics = ProxyMetrics()
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
        discovery = await _discovery(settings, brokers, stack)
        await stack.enter_async_context(monitor)
        metrics.watch_brokers(lambda: [(view.name, view.up) for view in brokers.views()])
        proxy = _proxy(settings, brokers.pool, metrics)
        brokers.came_up = proxy.broker_up
        stack.callback(proxy.close)  # announcements under way end with the proxy (a no-op after its graceful stop)
        await stack.enter_async_context(proxy.renewer)
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
        name = proxy_name(address)
        reporter = ConsumerReporter(proxy.consumers, brokers.pool, name, timeout_s=settings.broker_timeout_s)
        await stack.enter_async_context(reporter)
        proxy.renewer.elsewhere = reporter.reported_elsewhere  # a client that moved to another proxy stays renewed
        servicer = MessagingService(proxy, settings, endpoints_for(settings.advertise or address), metrics)
        stack.push_async_callback(servicer.close)
        # Receive frames may be pre-encoded (proxy/v2/receive.py's byte path): h2grpc writes bytes as they are.
        passing = server if isinstance(server, H2Server) else PassBytes(server)
        service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, passing)  # type: ignore[no-untyped-call]
        if settings.batch_receive:
            ext_grpc.add_MessagingServicer_to_server(ExtMessaging(servicer), passing)  # type: ignore[no-untyped-call]
        admin = AdminService(
            brokers.pool,
            brokers.views,
            Authenticator(settings.accounts, skew_s=settings.auth_skew_s),
            timeout_s=settings.broker_timeout_s,
        )
        admin_pb2_grpc.add_AdminServicer_to_server(admin, server)  # type: ignore[no-untyped-call]
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        await _serving(health_servicer, discovery, stack)
        await server.start()
        stack.push_async_callback(server.stop, None)  # a failure below must not leave it serving (no-op later)
        stack.enter_context(MemoryTrimmer())
        process = default_proxy_name(int(address.rpartition(":")[2]))
        await serve_metrics(stack, metrics.registry, settings, error=SettingsError)
        await export_metrics(stack, metrics.registry, settings, kind="proxy", process=process, error=SettingsError)
        # Serving without accounts is said at start — tests/integration/sdk/test_up.py::
        # test_the_environment_reaches_the_children_and_one_config_file_serves_them_all
        if not settings.accounts:
            log.warning("authentication is off: no [[acl]] accounts, every request is served without credentials")
        elif not settings.tls_cert:
            log.warning("authentication is on over plaintext: signed headers can be replayed while fresh; use TLS")
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
