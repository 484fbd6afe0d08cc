"""`popgate up --no-view` as a subprocess for tests, and its children found through /proc (Linux).

The children run in their own sessions, so neither a process-group kill nor the terminal reaches
them: a test records them once `up` is ready and checks afterwards that none is left.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

POPGATE = str(Path(sys.executable).with_name("popgate"))


@dataclass(frozen=True)
class Proc:
    pid: int
    started: int  # start time in clock ticks since boot: a reused pid has another one

    @property
    def alive(self) -> bool:
        fields = _stat(self.pid)
        return fields is not None and int(fields[19]) == self.started and fields[0] not in ("Z", "X")


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on; None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces


def children_of(pid: int) -> list[Proc]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None and int(fields[1]) == pid:
            out.append(Proc(int(entry.name), int(fields[19])))
    return out


class Up:
    """`popgate up --no-view` with its stderr read in a thread; `children` once it is ready."""

    def __init__(
        self, data_dir: Path, *, brokers: int = 1, env: dict[str, str] | None = None, extra: Sequence[str] = ()
    ) -> None:
        argv = [POPGATE, "up", "--brokers", str(brokers), "--no-view", "--listen", "127.0.0.1:0"]
        argv += ["--data-dir", str(data_dir), *extra]
        self.stdout_path = data_dir.parent / f"{data_dir.name}.stdout"  # what `up` prints: endpoint, brokers
        # Own session: signals in these tests go to `up` alone, as a terminal's would.
        with self.stdout_path.open("wb") as stdout:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        self.endpoint = ""
        self.lines: list[str] = []
        self.children: list[Proc] = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for raw in self.proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                self.lines.append(line)
                if line.startswith("ready ") and not self.endpoint:
                    self.endpoint = line.split(" ", 1)[1]
                    self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout_s: float) -> str:
        self._ready.wait(timeout_s)
        assert self.endpoint, "popgate up did not become ready:\n" + "\n".join(self.lines[-20:])
        self.children = children_of(self.proc.pid)
        return self.endpoint

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 30) -> int:
        """Send `sig` (SIGINT = Ctrl-C) and wait; its exit code. On a timeout, `kill_all` and raise."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise
        finally:
            self._reader.join(10)

    def brokers(self) -> dict[str, str]:
        """name -> address, from the line `up` printed once ready: "popgate: proxy endpoint E  (brokers b1=A, ...;"."""
        line = next(x for x in self.stdout_path.read_text().splitlines() if x.startswith("popgate: proxy endpoint"))
        listed = line.split("(brokers ", 1)[1].split(";", 1)[0]
        return dict(entry.split("=", 1) for entry in listed.split(", "))

    def wait_for_line(self, prefix: str, timeout_s: float) -> str:
        """The first stderr line starting with `prefix`, polled until `timeout_s`; AssertionError if none."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if line.startswith(prefix)]
            if found:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no line {prefix!r} within {timeout_s} s:\n" + "\n".join(self.lines[-20:]))

    def wait(self, timeout_s: float) -> int:
        """Wait for `up` to exit on its own; its exit code, with all its output read."""
        code = self.proc.wait(timeout_s)
        self._reader.join(10)
        return code

    def left_behind(self, timeout_s: float) -> list[Proc]:
        """The children still running after up to `timeout_s` (polled)."""
        deadline = time.monotonic() + timeout_s
        while (running := [c for c in self.children if c.alive]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return running

    def kill_all(self) -> None:
        """kill -9 `popgate up` and each child it had (a group kill would miss them: own sessions)."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        for child in self.children:
            if child.alive:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
        self.proc.wait(10)
