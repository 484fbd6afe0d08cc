"""Start real server processes (broker, proxy) for tests and wait for their ``ready <addr>`` line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

READY_TIMEOUT_S = 30.0


class ServerProcess:
    """A child process that prints ``ready HOST:PORT`` on stderr once it serves."""

    def __init__(self, module: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.module = module
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        self.lines: deque[str] = deque(maxlen=200)

    def start(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        ready = threading.Event()
        self._drainer = threading.Thread(target=self._drain, args=(self.proc, ready), daemon=True)
        self._drainer.start()
        if not ready.wait(READY_TIMEOUT_S) or not self.address:
            self.kill()
            raise RuntimeError(f"{self.module} did not become ready:\n" + "\n".join(self.lines))
        return self

    def _drain(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.lines.append(line.rstrip())
            if line.startswith("ready ") and not ready.is_set():
                self.address = line.split()[1]
                ready.set()
        proc.stderr.close()
        ready.set()

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._drainer.join(timeout)
        return self.proc.returncode

    def kill(self) -> None:
        """kill -9."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
            self._drainer.join(10)


def broker_args(name: str, data_dir: Path, *extra: str, listen: str = "127.0.0.1:0") -> list[str]:
    return ["--name", name, "--listen", listen, "--data-dir", str(data_dir), *extra]


def wait_until(predicate: object, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll a condition with a deadline (for state observed from outside a process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]
