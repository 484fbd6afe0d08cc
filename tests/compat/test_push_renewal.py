"""The official PushConsumer against a backlog it consumes slower than the invisible time: the proxy renews its
auto_renew messages (proxy/renewal.py), so each is consumed once and every ack succeeds — also when the proxy was
restarted under the running consumer.

The module's cluster runs the proxy with a 10 s default invisible time (the least it allows) so that a backlog of
~25 s shows what a 60 s one does to a slower consumer: before renewal (main at 3916db7), 400 messages gave 888
deliveries, 488 of them redeliveries (attempt 2 and more), and 1,112 ack errors ("40013 ... stale", "invalid receipt
handle") in the client's log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from popgate.cli.cluster import Cluster, ClusterConfig

Run = Callable[..., str]


@pytest.fixture(scope="module")
def cluster_env() -> dict[str, str]:
    return {"POPGATE_DEFAULT_INVISIBLE_S": "10"}


def test_push_consumer_backlog_slower_than_the_invisible_time_is_consumed_once(run_driver: Run) -> None:
    result = json.loads(run_driver("push_backlog", "compat_backlog", "g_backlog", timeout_s=180))
    assert result["consumed"] == result["sent"] == 400, result
    assert result["consume_s"] >= 20, result  # the backlog did outlast the invisible time twice over
    assert result["redelivered"] == 0, result
    assert result["deliveries"] == 400, result
    assert result["ack_errors"] == 0, result


def test_a_push_consumer_running_across_a_proxy_restart_is_still_renewed(tmp_path: Path) -> None:
    """The new proxy has no Telemetry stream of the running client (it rebuilds one only when a settings write fails:
    every 300 s); its heartbeats and receives make it alive there. Before: 300 messages gave 242 redeliveries and 506
    ack errors in a review's probe, all with renewal_untracked_total{reason="no_telemetry"}."""
    config = ClusterConfig(
        brokers=3, listen="127.0.0.1:0", data_dir=tmp_path / "data", proxy_args=("--default-invisible-s", "10")
    )
    with Cluster(config) as cluster:
        endpoint = cluster.endpoint
        driver = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("driver.py")), "push_backlog_after_proxy_restart", endpoint,
             "compat_restart", "g_restart"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ, HOME=str(tmp_path)),  # the client logs under ~/logs
            text=True,
        )  # fmt: skip
        try:
            assert driver.stdout is not None and driver.stdout.readline().strip() == "started"
            # Past the client's first settings write (1 s after its start; a write that fails rebuilds its stream,
            # the next comes 300 s later): nothing to wait on in another process but the client's own schedule.
            time.sleep(3)
            cluster.proxies[0].stop()
            cluster.add_proxy(endpoint)  # the same address: the client's channels connect to the new proxy
            out, err = driver.communicate("go\n", timeout=180)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
    assert driver.returncode == 0, f"{out}\n{err[-4000:]}"
    result = json.loads(out.strip().splitlines()[-1])
    assert result["consumed"] == result["sent"] == 400, result
    assert result["consume_s"] >= 20, result  # the backlog did outlast the invisible time twice over
    assert result["redelivered"] == 0, result
    assert result["deliveries"] == 400, result
    assert result["ack_errors"] == 0, result
