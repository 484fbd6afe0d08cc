"""The official rocketmq-python-client 5.1.2's producer features, in a subprocess, against `popgate up --brokers 3`
(and a second proxy on the same brokers): priority, recall and transactions (issue 29)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.sdk.popgate_up import Up
from tests.procs import ServerProcess

Run = Callable[..., str]
CHECKS = {  # the brokers' check times, short for the test (children of `popgate up` inherit them)
    "POPGATE_TRANSACTION_IMMUNITY_S": "1",
    "POPGATE_TRANSACTION_CHECK_INTERVAL_S": "2",
    "POPGATE_TRANSACTION_MAX_CHECKS": "3",
}


@pytest.fixture(scope="module")
def cluster_env() -> dict[str, str]:
    return {"POPGATE_MIN_INVISIBLE_S": "1", **CHECKS}


@pytest.fixture(scope="module")
def second_proxy(cluster_up: Up) -> Iterator[str]:
    """Another proxy in front of the same brokers: its endpoint."""
    brokers = [arg for name, address in cluster_up.brokers().items() for arg in ("--broker", f"{name}={address}")]
    proxy = ServerProcess("proxy", ["--listen", "127.0.0.1:0", *brokers]).start()
    try:
        yield proxy.address
    finally:
        proxy.stop()


def drive(endpoint: str, home: Path, scenario: str, topic: str, group: str, *extra: str) -> dict[str, object]:
    driver = Path(__file__).with_name("driver.py")
    done = subprocess.run(
        [sys.executable, str(driver), scenario, endpoint, topic, group, *extra],
        capture_output=True,
        env=dict(os.environ, HOME=str(home)),
        timeout=100,
        check=False,
    )
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, f"{scenario} failed:\n{out}\n{done.stderr.decode(errors='replace')[-4000:]}"
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_priority_messages_come_highest_first_within_each_queue(run_driver: Run) -> None:
    result = json.loads(run_driver("priority", "compat_priority", "g_priority"))
    assert result["received"] == 48 and result["queues"] > 1


def test_a_recalled_delay_message_is_never_delivered_and_bad_recalls_are_clear_errors(run_driver: Run) -> None:
    result = json.loads(run_driver("recall", "compat_recall", "g_recall"))
    assert result == {"recall_again": 40400, "garbage": 40000, "delivered": 40400}  # NOT_FOUND, BAD_REQUEST


def test_commit_is_delivered_once_rollback_never_and_bad_ids_are_invalid_transaction_id(run_driver: Run) -> None:
    result = json.loads(run_driver("transactions", "compat_tx", "g_tx"))
    assert result["resent"] == "no error"  # the same COMMIT again: answered as the first
    assert result["stale"] == 40008 and result["forged"] == 40008  # INVALID_TRANSACTION_ID


def test_an_orphaned_half_message_is_checked_on_another_producer_through_another_proxy(
    cluster_up: Up, second_proxy: str, tmp_path: Path
) -> None:
    orphan = drive(cluster_up.endpoint, tmp_path, "orphan_half", "compat_orphan", "g_orphan")
    result = drive(second_proxy, tmp_path, "orphan_check", "compat_orphan", "g_orphan", str(orphan["message_id"]))
    assert result == {"asked": True}
