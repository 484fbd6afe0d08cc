"""One server process of a local cluster (`Child`): started, awaited until ready, its stderr drained, stopped."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """A child did not start (its log tail is in the message)."""


class ClusterInterrupted(ClusterError):
    """`Cluster.start` was told to stop (its ``stop`` event) before every child was ready."""


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking the kernel to SIGTERM the child when the thread that forked it dies (Linux).

    SIGTERM, not SIGKILL: a broker still closes its store. None off Linux.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the request took effect
            os._exit(1)

    return preexec


@dataclass
class Child:
    """One server process: started, awaited until it reports ``ready <address>``, stopped.

    Its stderr goes to `log_path` (None: nowhere), and its last `keep_lines` lines stay
    in `lines`. With `own_session`, a terminal's Ctrl-C does not reach it. With
    `die_with_parent`, it gets SIGTERM when the thread that started it ends, however
    that happens (PR_SET_PDEATHSIG; start it from a thread that lives as long as it should).
    """

    name: str
    argv: list[str]
    log_path: Path | None
    process: subprocess.Popen[bytes] | None = None
    address: str = ""
    metrics_address: str = ""  # HOST:PORT of its /metrics, from the line it logs before ready ('' when none)
    keep_lines: int = 20
    own_session: bool = True
    die_with_parent: bool = False
    _ready: threading.Event = field(default_factory=threading.Event)
    _tail: list[str] = field(default_factory=list)
    _terminated: bool = False
    _reader: threading.Thread | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        """Start the process; OSError when its log file cannot be opened (nothing started then)."""
        # A fresh event per start: the previous process's stderr reader may still set its own at EOF.
        self._ready = threading.Event()
        self._terminated = False
        self.address = ""
        self.metrics_address = ""
        log_file = self._open_log()
        try:
            # Own session: a terminal's Ctrl-C reaches only `popgate up`, which then stops the children
            # in order (proxies first, so held receives are answered while brokers still serve).
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=self.own_session,
                preexec_fn=_die_with_parent() if self.die_with_parent else None,
            )
        except BaseException:
            if log_file is not None:
                log_file.close()
            raise
        assert self.process.stderr is not None
        drain_args = (self.process.stderr, log_file, self._ready)
        self._reader = threading.Thread(target=self._drain, args=drain_args, name=f"{self.name}-stderr", daemon=True)
        self._reader.start()

    def _open_log(self) -> IO[bytes] | None:
        if self.log_path is None:
            return None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        return self.log_path.open("ab")

    def _drain(self, stream: IO[bytes], log_file: IO[bytes] | None, ready: threading.Event) -> None:
        try:
            with stream, log_file or contextlib.nullcontext():
                out = log_file
                for raw in stream:
                    if out is not None:
                        try:
                            out.write(raw)
                            out.flush()
                        except OSError as exc:  # keep draining the pipe, or the child blocks writing to it
                            log.warning("%s: writing %s failed (%s); no more log", self.name, self.log_path, exc)
                            out = None
                    line = raw.decode(errors="replace").rstrip()
                    # A new list, not an append: readers in other threads iterate over the old one safely.
                    self._tail = [*self._tail, line][-self.keep_lines :]
                    if not ready.is_set() and not self.metrics_address and "metrics on http://" in line:
                        self.metrics_address = line[line.index("http://") :].split()[0].split("/")[2]
                    if not ready.is_set() and line.startswith("ready "):
                        self.address = line.split(" ", 1)[1].strip()
                        ready.set()
        finally:
            ready.set()  # the process ended (or this reader failed): wake a waiter (address stays empty)

    @property
    def ended(self) -> bool:
        """Its stderr reader is done without a ``ready`` line: the child is ending or has ended."""
        return self._ready.is_set() and not self.address

    def wait_ready(self, timeout_s: float, stop: threading.Event | None = None) -> str:
        if stop is None:
            if not self._ready.wait(timeout_s) or not self.address:
                raise self._failure(timeout_s)
            return self.address
        wait_all_ready([self], timeout_s, stop)
        return self.address

    def _failure(self, timeout_s: float) -> ClusterError:
        tail = "\n  ".join(self._tail[-10:])
        code = None
        if self.process is not None and self._ready.is_set():  # stderr closed: the child is ending
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.process.wait(5)
        what = ended(code) if code is not None else f"did not report ready within {timeout_s:g} s"
        return ClusterError(f"{self.name} {what}; last output:\n  {tail}")

    @property
    def lines(self) -> list[str]:
        """The last `keep_lines` lines of its stderr."""
        return list(self._tail)

    @property
    def metrics_url(self) -> str:
        """The /metrics URL the child logged before its ready line ('' when it serves none)."""
        return f"http://{self.metrics_address}/metrics" if self.metrics_address else ""

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

    def on_exit(self, died: Callable[[Child, int], None]) -> None:
        """Call ``died(self, exit code)``, from a thread blocked in wait(), if this process ends without
        having been told to stop (a crash, kill -9, the OOM killer); its last output is read by then."""
        process = self.process
        if process is None:
            return

        def watch() -> None:
            code = process.wait()
            if not self._terminated and self.process is process:
                self._join(2.0)
                died(self, code)

        threading.Thread(target=watch, name=f"{self.name}-exit", daemon=True).start()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self._join(10)

    def _join(self, timeout_s: float) -> None:
        if self._reader is not None:
            self._reader.join(timeout_s)


def wait_all_ready(children: Sequence[Child], timeout_s: float, stop: threading.Event | None = None) -> None:
    """Wait until every child reported ready; ClusterError as soon as one of them has ended instead,
    ClusterInterrupted as soon as ``stop`` is set (Ctrl-C while a broker loads its store)."""
    deadline = time.monotonic() + timeout_s
    pending = list(children)
    while True:
        if stop is not None and stop.is_set():
            raise ClusterInterrupted("interrupted while starting")
        for child in pending:
            if child.ended:
                raise child._failure(timeout_s)  # its exit code and last output
        pending = [c for c in pending if not c.address]
        if not pending:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise pending[0]._failure(timeout_s)
        time.sleep(min(0.05, left))  # several children, each with its own event: poll them


def ended(code: int) -> str:
    """How a child ended, from its return code (-N: killed by signal N, as subprocess reports it)."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by signal {-code} ({signal.Signals(-code).name})"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"
