"""`popgate up --brokers 3 --no-view` for the official-client tests, started once per module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

POPGATE = str(Path(sys.executable).with_name("popgate"))


class Up:
    def __init__(self, data_dir: Path, *, env: dict[str, str]) -> None:
        argv = [POPGATE, "up", "--brokers", "3", "--no-view", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]
        # Own session: if `popgate up` itself misbehaves, its whole group can still be killed.
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True
        )
        self.endpoint = ""
        self.lines: list[str] = []
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
        return self.endpoint

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # what Ctrl-C does
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise
        finally:
            self._reader.join(10)


@pytest.fixture(scope="module")
def cluster_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    data = tmp_path_factory.mktemp("up")
    # Children inherit the environment: POPGATE_MIN_INVISIBLE_S lets the proxy accept the
    # short invisible times that keep the redelivery test quick.
    env = dict(os.environ, POPGATE_MIN_INVISIBLE_S="1")
    up = Up(data, env=env)
    try:
        up.wait_ready(60)
        yield up
    finally:
        code = up.stop()
    assert code == 0, f"popgate up exited with {code}"


@pytest.fixture
def run_driver(cluster_up: Up, tmp_path: Path) -> object:
    def run(scenario: str, topic: str, group: str, timeout_s: float = 100) -> str:
        env = dict(os.environ, HOME=str(tmp_path))  # the client logs under ~/logs
        driver = Path(__file__).with_name("driver.py")
        done = subprocess.run(
            [sys.executable, str(driver), scenario, cluster_up.endpoint, topic, group],
            capture_output=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
        out = done.stdout.decode(errors="replace")
        assert done.returncode == 0, f"{scenario} failed:\n{out}\n{done.stderr.decode(errors='replace')[-4000:]}"
        return out.strip().splitlines()[-1]

    return run
