"""The official RocketMQ 5 Node.js client (rocketmq-client-nodejs, tests/compat/node/package.json), in a Node.js
subprocess, against `popgate up --brokers 3`. `make test` installs it (deploy/install-test-deps.sh: `npm ci`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.integration.sdk.popgate_up import Up

NODE_DIR = Path(__file__).with_name("node")
CLIENT = NODE_DIR / "node_modules" / "rocketmq-client-nodejs" / "package.json"

# Not skipped when missing: a skip would hide a broken install step.
if shutil.which("node") is None or not CLIENT.exists():
    raise RuntimeError(
        "Node.js and tests/compat/node/node_modules are required: deploy/install-test-deps.sh installs them"
        " (make test runs it)"
    )

Run = Callable[..., dict[str, object]]


@pytest.fixture(scope="module")
def cluster_env() -> dict[str, str]:
    """Short invisible times for the redelivery checks; a 5 s long poll pushed to PushConsumers, because the Node.js
    PushConsumer's shutdown waits for its receives in flight (up to the long-polling time) before it ends."""
    return {"POPGATE_MIN_INVISIBLE_S": "1", "POPGATE_DEFAULT_LONG_POLLING_S": "5"}


@pytest.fixture
def run_node(cluster_up: Up, tmp_path: Path) -> Run:
    def run(scenario: str, topic: str, group: str, timeout_s: float = 100) -> dict[str, object]:
        env = dict(os.environ, HOME=str(tmp_path))  # the client logs under ~/logs/rocketmq
        try:  # within the per-test timeout (pyproject), so that a scenario that hangs shows what it said
            done = subprocess.run(
                ["node", "driver.mjs", scenario, cluster_up.endpoint, topic, group],
                cwd=NODE_DIR,
                capture_output=True,
                env=env,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            said = (exc.stderr or b"").decode(errors="replace")[-4000:]
            pytest.fail(f"{scenario} did not end within {timeout_s} s:\n{said}")
        out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        assert done.returncode == 0, f"{scenario} failed:\n{out}\n{err[-4000:]}"
        result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
        return result

    return run


def test_producer_fields_reach_a_simple_consumer_as_sent_and_acked_ones_stay_away(run_node: Run) -> None:
    """Tags, keys, user properties, a delivery timestamp (not delivered before it), a message group (in order),
    binary and 64 KiB bodies (the digest checked by the client); every field compared by the driver."""
    result = run_node("produce_consume", "node_basic", "g_node_basic")
    assert result["sent"] == result["received"] == 28
    assert result["client_problems"] == 0


def test_change_invisibility_brings_a_message_back_and_its_new_handle_acks_it(run_node: Run) -> None:
    result = run_node("invisibility", "node_invisible", "g_node_invisible")
    assert result["changed_back_after_ms"] < 10_000  # received with 20 s, changed to 1 s
    assert result["stale_ack"] == 40013  # the handle it was received with: INVALID_RECEIPT_HANDLE


def test_push_consumer_consumes_100_messages_each_once_and_acks_them(run_node: Run) -> None:
    result = run_node("push", "node_push", "g_node_push")
    assert result["consumed"] == result["deliveries"] == 100


def test_push_consumer_retries_a_failed_message_which_comes_back_with_attempt_2(run_node: Run) -> None:
    """The Node.js client reads no customized back-off (the retry policy RocketMQ's proxy and popgate send): it nacks
    with no delay, so the message is back at once (docs/PROXY.md, "Official clients")."""
    result = run_node("push_retry", "node_push_retry", "g_node_push_retry")
    assert result["retried"] == 10  # each consumed on its second delivery, attempt 2 (the driver checks)
