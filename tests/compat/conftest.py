"""`popgate up --brokers 3 --no-view` for the official-client tests, started once per module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.sdk.popgate_up import Proc, Up


@pytest.fixture(scope="module")
def cluster_env() -> dict[str, str]:
    """POPGATE_* settings the module's cluster runs with (children inherit the environment): POPGATE_MIN_INVISIBLE_S
    lets the proxy accept the short invisible times that keep the redelivery tests quick. A module may override it."""
    return {"POPGATE_MIN_INVISIBLE_S": "1", "POPGATE_FIFO_GROUP": "g_fifo_push"}  # g_fifo_push: an orderly group


@pytest.fixture(scope="module")
def cluster_up(tmp_path_factory: pytest.TempPathFactory, cluster_env: dict[str, str]) -> Iterator[Up]:
    data = tmp_path_factory.mktemp("up")
    env = dict(os.environ, **cluster_env)
    up = Up(data, brokers=3, env=env)
    left: list[Proc] = []
    try:
        up.wait_ready(60)
        assert len(up.children) == 4, up.children  # b1..b3 and the proxy
        yield up
    finally:
        try:
            code = up.stop(signal.SIGINT)  # what Ctrl-C does; on a timeout everything is killed
        finally:
            left = up.left_behind(10)
            up.kill_all()  # the children run in their own sessions: killed one by one, if any is left
    assert code == 0, f"popgate up exited with {code}:\n" + "\n".join(up.lines[-20:])
    assert left == [], f"popgate up left children running: {left}"


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
