"""The official rocketmq-python-client 5.1.2, in a subprocess, against `popgate up --brokers 3`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

# find_spec, not import: the client's protobuf classes must never load into this process.
if importlib.util.find_spec("rocketmq") is None:
    raise RuntimeError("rocketmq-python-client is required (the dev extra installs it: make test)")

Run = Callable[..., str]


def test_producer_and_simple_consumer_send_receive_ack_once(run_driver: Run) -> None:
    result = json.loads(run_driver("send_receive", "compat_basic", "g_basic"))
    assert result == {"sent": 30, "received": 30}


def test_change_invisibility_and_unacked_message_come_back_with_attempt_2(run_driver: Run) -> None:
    result = json.loads(run_driver("redelivery", "compat_redeliver", "g_redeliver"))
    assert result["changed_back_after_s"] < 10  # received with 20 s, changed to 1 s
    assert result["unacked_returned_after_s"] >= 2


def test_empty_long_poll_returns_no_messages_after_about_the_polling_time(run_driver: Run) -> None:
    result = json.loads(run_driver("empty_poll", "compat_empty", "g_empty"))
    assert 2 <= result["empty_poll_s"] <= 5


def test_garbage_receipt_handle_and_oversized_body_are_errors(run_driver: Run) -> None:
    result = json.loads(run_driver("errors", "compat_errors", "g_errors"))
    assert result["garbage_ack"] == 40013  # INVALID_RECEIPT_HANDLE
    assert result["oversized_server"] == 41301  # MESSAGE_BODY_TOO_LARGE


def test_fifo_messages_go_to_two_consumers_of_a_group_in_order_one_at_a_time(run_driver: Run) -> None:
    result = json.loads(run_driver("fifo", "compat_fifo", "g_fifo"))
    assert result["in_order"] == 10
    assert result["held_back_poll_s"] >= 2  # the held-back receive waited its long poll, then got nothing


def test_push_consumer_of_a_fifo_group_consumes_each_message_group_in_order(run_driver: Run) -> None:
    result = json.loads(run_driver("fifo_push", "compat_fifo_push", "g_fifo_push"))
    assert result["groups"] == 4  # each in order, its message 3 retried before its message 4 (the driver checks)


def test_push_consumer_consumes_100_messages(run_driver: Run) -> None:
    result = json.loads(run_driver("push", "compat_push", "g_push"))
    assert result["consumed"] == 100


def test_our_proto_subset_matches_the_official_protocol_field_for_field(tmp_path: Path) -> None:
    """Same package, names, numbers, types, oneofs and RPCs as the official client's generated code."""
    script = Path(__file__).with_name("describe.py")

    def describe(side: str) -> list[str]:
        env = dict(os.environ, HOME=str(tmp_path))
        done = subprocess.run([sys.executable, str(script), side], capture_output=True, env=env, timeout=60, check=True)
        return done.stdout.decode().splitlines()

    ours, official = describe("ours"), describe("official")
    assert len(official) > 300
    assert ours == official
