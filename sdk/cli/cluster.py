"""A local popgate cluster: N brokers and a proxy as child processes (what `popgate up` runs).

Each child prints ``ready <address>`` on stderr once it serves; a reader thread per
child waits for that line, then keeps draining stderr into ``<data-dir>/<name>.log``
so a chatty child never blocks on a full pipe. Stopping sends SIGTERM, waits, then
kills what is left. With `die_with_parent` (what `popgate up` uses) a child also gets
SIGTERM from the kernel when its parent dies, even by SIGKILL (Linux only). `Child` (in
`child`, importable from here) is also what the tests start single servers with (tests/procs.py).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .child import Child, ClusterError, ClusterInterrupted, ended, wait_all_ready

# What tests, bench/ and `popgate up` import from here, `child`'s names among them.
__all__ = [
    "Child",
    "Cluster",
    "ClusterConfig",
    "ClusterError",
    "ClusterInterrupted",
    "ended",
    "pinned",
    "wait_all_ready",
]


def pinned(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """`argv` with `flag`'s value set to `value`: its last ``--flag VALUE`` or ``--flag=VALUE`` replaced, or
    ``--flag VALUE`` appended (a flag wins over the inherited environment) — tests/unit/sdk/test_supervisor.py."""
    out = list(argv)
    for i in range(len(out) - 1, -1, -1):
        if out[i] == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if out[i].startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, flag, value]


@dataclass(frozen=True)
class ClusterConfig:
    brokers: int = 3
    listen: str = "127.0.0.1:8081"
    data_dir: Path = Path("./data")
    receive_mode: str = ""  # "" = the proxy's own (adaptive, or its POPGATE_RECEIVE_MODE)
    export_dir: str = ""
    flush: str = ""
    metrics: bool = False  # every child serves /metrics on a free port (see Child.metrics_url)
    proxy_args: Sequence[str] = ()
    broker_args: Sequence[str] = ()
    # Brokers create topics on their first send: `popgate up`'s dev mode (a broker's own default is off). Given
    # before broker_args, so a --no-auto-create there wins.
    auto_create: bool = True
    ready_timeout_s: float = 30.0
    die_with_parent: bool = False  # children get SIGTERM when the starting thread dies (Child.die_with_parent)


class Cluster:
    """Brokers b1..bN and one proxy. Use as a context manager; `stop()` always cleans up."""

    def __init__(self, config: ClusterConfig, *, python: str = sys.executable) -> None:
        self.config = config
        self.python = python
        self.brokers: dict[str, Child] = {}
        self.proxies: list[Child] = []
        self._env = dict(os.environ, PYTHONUNBUFFERED="1")

    @property
    def endpoint(self) -> str:
        return self.proxies[0].address

    def broker_targets(self) -> list[str]:
        return [f"{name}={child.address}" for name, child in self.brokers.items()]

    def _broker_argv(self, name: str, listen: str) -> list[str]:
        c = self.config
        argv = [self.python, "-m", "broker", "--name", name, "--listen", listen]
        argv += ["--data-dir", str(c.data_dir / name)]
        if c.export_dir:
            argv += ["--export-dir", str(Path(c.export_dir) / name)]
        if c.flush:
            argv += ["--flush", c.flush]
        if c.metrics:
            argv += ["--metrics-listen", "127.0.0.1:0"]
        if c.auto_create:
            argv.append("--auto-create")
        return argv + list(c.broker_args)

    def start(self, stop: threading.Event | None = None) -> str:
        """Start every broker, then the proxy; the proxy's endpoint.

        ClusterError, with the cause, when the data directory is unusable or a child exits
        or stays silent instead of reporting ready; ClusterInterrupted when ``stop`` is set
        before all are ready (the others are stopped then, either way).
        """
        try:
            data_dir = self.config.data_dir
            try:
                data_dir.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ClusterError(f"cannot create the data directory {data_dir}: {exc.strerror or exc}") from exc
            try:
                for i in range(1, self.config.brokers + 1):
                    if stop is not None and stop.is_set():  # Ctrl-C while brokers are still being spawned
                        raise ClusterInterrupted("interrupted while starting")
                    name = f"b{i}"
                    child = self._child(name, self._broker_argv(name, "127.0.0.1:0"))
                    self.brokers[name] = child
                    child.start(self._env)
            except OSError as exc:
                raise ClusterError(f"cannot start the brokers: {exc}") from exc
            wait_all_ready(list(self.brokers.values()), self.config.ready_timeout_s, stop)
            self.add_proxy(self.config.listen, stop=stop)
        except BaseException:
            self.stop()
            raise
        return self.endpoint

    def _child(self, name: str, argv: list[str]) -> Child:
        log = self.config.data_dir / f"{name}.log"
        return Child(name, argv, log, die_with_parent=self.config.die_with_parent)

    def add_proxy(
        self, listen: str = "127.0.0.1:0", extra: Sequence[str] = (), *, stop: threading.Event | None = None
    ) -> str:
        """Start one more proxy over the same brokers; its address."""
        argv = [self.python, "-m", "proxy", "--listen", listen]
        if self.config.receive_mode:
            argv += ["--receive-mode", self.config.receive_mode]
        for target in self.broker_targets():
            argv += ["--broker", target]
        if self.config.metrics:
            argv += ["--metrics-listen", "127.0.0.1:0"]
        name = "proxy" if not self.proxies else f"proxy{len(self.proxies) + 1}"
        if self.config.export_dir:
            argv += ["--export-dir", str(Path(self.config.export_dir) / name)]
        argv += [*self.config.proxy_args, *extra]
        child = self._child(name, argv)
        try:
            child.start(self._env)
        except OSError as exc:
            raise ClusterError(f"cannot start {name}: {exc}") from exc
        self.proxies.append(child)
        return child.wait_ready(self.config.ready_timeout_s, stop)

    def children(self) -> list[Child]:
        return [*self.brokers.values(), *self.proxies]

    def child(self, name: str) -> Child:
        found = [c for c in self.children() if c.name == name]
        if not found:
            raise KeyError(name)
        return found[0]

    def restart_child(self, name: str, *, stop: threading.Event | None = None) -> str:
        """Start a broker or proxy that ended again with its old argv, on the gRPC and metrics addresses it
        had (so clients, `--broker` lists and Prometheus targets stay right) and, for a broker, its data
        directory; its address once ready. ClusterError when it does not become ready (it may still run then)."""
        child = self.child(name)
        if child.running:
            raise ClusterError(f"{name} is still running")
        argv = pinned(child.argv, "--listen", child.address) if child.address else child.argv
        if child.metrics_address:
            argv = pinned(argv, "--metrics-listen", child.metrics_address)
        child.argv = argv
        try:
            child.start(self._env)
        except OSError as exc:
            raise ClusterError(f"cannot start {name}: {exc}") from exc
        return child.wait_ready(self.config.ready_timeout_s, stop)

    def on_exit(self, died: Callable[[Child, int], None]) -> None:
        """`Child.on_exit` for every child started so far: ``died`` hears of one that ends on its own."""
        for child in self.children():
            child.on_exit(died)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Proxies first (they answer held receives), then brokers; SIGTERM, wait, then kill."""
        for group in (self.proxies, list(self.brokers.values())):
            for child in group:
                child.terminate()
            for child in group:
                child.stop(timeout_s)

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
