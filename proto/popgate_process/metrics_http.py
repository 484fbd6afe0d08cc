"""A tiny asyncio HTTP server for Prometheus ``/metrics`` (and ``/livez``, alias ``/healthz``).

It runs on the process's event loop, so collectors read live state without
locks. Only GET is served; each connection answers one request and closes.
``/livez`` answers 200 whenever the loop turns, whatever the process's gRPC health says: the servers' pods use it
as their liveness (and a broker's as its startup) probe — tests/deploy/test_k8s.py.
Live state is read on the loop; the metric families are built and formatted
as text in a worker thread (see `_exposition`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import platform
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Protocol

import grpc
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from popgate_process.export import ExportSettings, MetricsExporter
from popgate_process.staged import gather

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 8192
# A scraper that does not read its page within this long is dropped (each connection holds its own copy of the
# page, which grows with the topic and group series), and no more than MAX_CONNECTIONS are served at once: the ones
# past it are closed unanswered — tests/integration/process/test_metrics_http.py.
WRITE_TIMEOUT_S = 30.0
MAX_CONNECTIONS = 32
BUILD_INFO_HELP = "Always 1: the popgate, Python and grpcio versions this process runs"


class MetricsServer:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: asyncio.Server | None = None
        self._rendering = asyncio.Lock()  # one exposition at a time: concurrent scrapes each held a copy
        self.address = ""
        self.connections = 0  # being served now

    async def start(self, listen: str) -> str:
        host, _, port = listen.rpartition(":")
        self._server = await asyncio.start_server(self._handle, host or "127.0.0.1", int(port))
        sock = self._server.sockets[0].getsockname()
        self.address = f"{sock[0]}:{sock[1]}"
        return self.address

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connections >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self.connections += 1
        try:
            await self._answer(reader, writer)
        finally:
            self.connections -= 1

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            if len(head) > MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            method, target, *_ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            path = target.split("?")[0]
            if method not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"only GET\n"
            elif path == "/metrics":
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, await self._exposition()
            elif path in ("/livez", "/healthz"):
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            allow = "Allow: GET, HEAD\r\n" if status.startswith("405") else ""
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{allow}"
                "Connection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else body)  # HEAD: the GET's headers, no body
            )
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
        except TimeoutError:
            writer.transport.abort()  # what it did not read is dropped, not kept for a close that never flushes
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            pass
        except Exception:  # a scrape must never take the process down
            log.exception("metrics request failed")
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _exposition(self) -> bytes:
        async with self._rendering:
            return await _exposition(self.registry)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


class MetricsFlags(Protocol):
    """The metrics flags a broker's and the proxy's settings share."""

    @property
    def metrics_listen(self) -> str: ...

    @property
    def export_dir(self) -> str: ...

    @property
    def export_interval_s(self) -> float: ...


async def serve_metrics(
    stack: AsyncExitStack, registry: CollectorRegistry, flags: MetricsFlags, *, error: Callable[[str], Exception]
) -> None:
    """The process's own families registered in `registry`, and /metrics served on --metrics-listen when set,
    closed by `stack` (a broker serves it before reading its store). A flag the operator must fix (a port in use, an
    address that is not local) raises ``error(one line naming it)``; so does `export_metrics`'."""
    # No `<counter>_created` series: nothing reads them (the export leaves them out), and per-group counters and
    # histograms would add one per series.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    register_process_metrics(registry)
    if flags.metrics_listen:
        server = MetricsServer(registry)
        try:
            address = await server.start(flags.metrics_listen)
        except (OSError, ValueError, OverflowError) as exc:  # in use or not local; a port not a number or too big
            raise error(f"--metrics-listen {flags.metrics_listen}: cannot serve /metrics there ({exc})") from None
        stack.push_async_callback(server.close)
        log.info("metrics on http://%s/metrics", address)


async def export_metrics(
    stack: AsyncExitStack,
    registry: CollectorRegistry,
    flags: MetricsFlags,
    *,
    kind: str,
    process: str,
    error: Callable[[str], Exception],
) -> None:
    """Snapshots of `registry` (a broker's or the proxy's: `kind`, named `process`) exported to --export-dir when set,
    closed by `stack`, after `serve_metrics`.
    Its first snapshot is the run's baseline (`RunSnapshots`): taken once every family the process will have is
    registered, so that a family registered later does not count its whole value as an increase. Only a directory
    that can never be one (`export.check_dir`) is a start error; I/O trouble is logged and retried."""
    if flags.export_dir:
        export = ExportSettings(Path(flags.export_dir), process, kind, flags.export_interval_s)
        try:
            await stack.enter_async_context(MetricsExporter(registry, export))
        except OSError as exc:
            raise error(f"--export-dir {flags.export_dir}: {exc.strerror or exc}") from None


def build_labels() -> dict[str, str]:
    """`popgate_build_info`'s labels: popgate's version as installed, the Python and grpcio versions."""
    try:
        version = importlib.metadata.version("popgate")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        version = "unknown"
    return {"version": version, "python": platform.python_version(), "grpc": grpc.__version__}


class _BuildInfo(Collector):
    def __init__(self) -> None:
        self._labels = build_labels()

    def describe(self) -> Iterator[Metric]:  # its name known to the registry: a second registration is refused
        yield GaugeMetricFamily("popgate_build_info", "", labels=list(self._labels))

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("popgate_build_info", BUILD_INFO_HELP, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), 1.0)
        yield family


def register_process_metrics(registry: CollectorRegistry) -> None:
    """The client library's default collectors in `registry` — `process_*` (CPU, memory, file descriptors, start
    time), `python_info`, `python_gc_*` — and `popgate_build_info`, as every popgate server exports them beside its
    own metrics. Idempotent: a registry that has them keeps them —
    tests/unit/process/test_process_metrics.py."""
    try:
        registry.register(_BuildInfo())
    except ValueError:  # registered before, with the others
        return
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


class _Collected:
    """Metric families already collected, as `generate_latest` reads a registry."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


async def _exposition(registry: CollectorRegistry) -> bytes:
    """The registry's text exposition. Collectors read live state (not thread-safe): on the loop, a broker's
    per-pair figures in slices (popgate_process.staged). Families are built and formatted in a worker thread, so a
    large page (many topics and groups: docs/BROKER.md, "/metrics") never stalls the loop."""
    build = await gather(registry)
    return await asyncio.get_running_loop().run_in_executor(None, lambda: generate_latest(_Collected(build())))
