"""A local popgate cluster: N brokers and a proxy as child processes (what `popgate up` runs).

Each child prints ``ready <address>`` on stderr once it serves; a reader thread per
child waits for that line, then keeps draining stderr into ``<data-dir>/<name>.log``
so a chatty child never blocks on a full pipe. Stopping sends SIGTERM, waits, then
kills what is left. `Child` is also what the tests start single servers with
(tests/procs.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """A child did not start (its log tail is in the message)."""


@dataclass
class Child:
    """One server process: started, awaited until it reports ``ready <address>``, stopped.

    Its stderr goes to `log_path` (None: nowhere), and its last `keep_lines` lines stay
    in `lines`. With `own_session`, a terminal's Ctrl-C does not reach it.
    """

    name: str
    argv: list[str]
    log_path: Path | None
    process: subprocess.Popen[bytes] | None = None
    address: str = ""
    keep_lines: int = 20
    own_session: bool = True
    _ready: threading.Event = field(default_factory=threading.Event)
    _tail: list[str] = field(default_factory=list)
    _terminated: bool = False
    _reader: threading.Thread | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        # A fresh event per start: the previous process's stderr reader may still set its own at EOF.
        self._ready = threading.Event()
        self._terminated = False
        self.address = ""
        # Own session: a terminal's Ctrl-C reaches only `popgate up`, which then stops the children
        # in order (proxies first, so held receives are answered while brokers still serve).
        self.process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=self.own_session,
        )
        assert self.process.stderr is not None
        self._reader = threading.Thread(
            target=self._drain, args=(self.process.stderr, self._ready), name=f"{self.name}-stderr", daemon=True
        )
        self._reader.start()

    def _log(self) -> contextlib.AbstractContextManager[IO[bytes] | None]:
        if self.log_path is None:
            return contextlib.nullcontext()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        return self.log_path.open("ab")

    def _drain(self, stream: IO[bytes], ready: threading.Event) -> None:
        with stream, self._log() as out:
            for raw in stream:
                if out is not None:
                    out.write(raw)
                    out.flush()
                line = raw.decode(errors="replace").rstrip()
                # A new list, not an append: readers in other threads iterate over the old one safely.
                self._tail = [*self._tail, line][-self.keep_lines :]
                if not ready.is_set() and line.startswith("ready "):
                    self.address = line.split(" ", 1)[1].strip()
                    ready.set()
        ready.set()  # the process ended: wake a waiter (address stays empty)

    def wait_ready(self, timeout_s: float) -> str:
        if not self._ready.wait(timeout_s) or not self.address:
            tail = "\n  ".join(self._tail[-10:])
            code = None
            if self.process is not None and self._ready.is_set():  # stderr closed: the child is ending
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.process.wait(5)
            what = f"exited with code {code}" if code is not None else f"did not report ready within {timeout_s:g} s"
            raise ClusterError(f"{self.name} {what}; last output:\n  {tail}")
        return self.address

    @property
    def lines(self) -> list[str]:
        """The last `keep_lines` lines of its stderr."""
        return list(self._tail)

    @property
    def metrics_url(self) -> str:
        """The /metrics URL the child logged before its ready line ('' when it serves none)."""
        for line in self._tail:
            if "metrics on http://" in line:
                return line[line.index("http://") :].split()[0]
        return ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.process is not None
            self.process.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM, once: a second one could land after the child's handler is gone and kill it."""
        if not self._terminated:
            self._terminated = True
            self.signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, wait up to timeout_s, then SIGKILL; the exit code (its last output read by then)."""
        if self.process is None:
            return None
        self.terminate()
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %g s; killing it", self.name, timeout_s)
            self.process.kill()
            code = self.process.wait(timeout_s)
        self._join(timeout_s)
        return code

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self._join(10)

    def _join(self, timeout_s: float) -> None:
        if self._reader is not None:
            self._reader.join(timeout_s)


@dataclass(frozen=True)
class ClusterConfig:
    brokers: int = 3
    listen: str = "127.0.0.1:8081"
    data_dir: Path = Path("./data")
    receive_mode: str = "adaptive"
    export_dir: str = ""
    flush: str = ""
    metrics: bool = False  # every child serves /metrics on a free port (see Child.metrics_url)
    proxy_args: Sequence[str] = ()
    broker_args: Sequence[str] = ()
    ready_timeout_s: float = 30.0


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
        return argv + list(c.broker_args)

    def start(self) -> str:
        """Start every broker, then the proxy; the proxy's endpoint."""
        try:
            for i in range(1, self.config.brokers + 1):
                name = f"b{i}"
                child = Child(name, self._broker_argv(name, "127.0.0.1:0"), self.config.data_dir / f"{name}.log")
                child.start(self._env)
                self.brokers[name] = child
            for child in self.brokers.values():
                child.wait_ready(self.config.ready_timeout_s)
            self.add_proxy(self.config.listen)
        except BaseException:
            self.stop()
            raise
        return self.endpoint

    def add_proxy(self, listen: str = "127.0.0.1:0", extra: Sequence[str] = ()) -> str:
        """Start one more proxy over the same brokers; its address."""
        argv = [self.python, "-m", "proxy", "--listen", listen, "--receive-mode", self.config.receive_mode]
        for target in self.broker_targets():
            argv += ["--broker", target]
        if self.config.metrics:
            argv += ["--metrics-listen", "127.0.0.1:0"]
        name = "proxy" if not self.proxies else f"proxy{len(self.proxies) + 1}"
        if self.config.export_dir:
            argv += ["--export-dir", str(Path(self.config.export_dir) / name)]
        argv += [*self.config.proxy_args, *extra]
        child = Child(name, argv, self.config.data_dir / f"{name}.log")
        child.start(self._env)
        self.proxies.append(child)
        return child.wait_ready(self.config.ready_timeout_s)

    def restart_broker(self, name: str) -> str:
        """Start a stopped or killed broker again on its old address and data directory."""
        child = self.brokers[name]
        if child.running:
            raise ClusterError(f"{name} is still running")
        old = child.address
        child.argv = self._broker_argv(name, old)
        child.start(self._env)
        child.wait_ready(self.config.ready_timeout_s)
        return child.address

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
