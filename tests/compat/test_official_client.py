"""The official rocketmq-python-client 5.1.2, in a subprocess, against `popgate up --brokers 3`."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable

import pytest

# find_spec, not import: the client's protobuf classes must never load into this process.
if importlib.util.find_spec("rocketmq") is None:
    pytest.skip("rocketmq-python-client is not installed", allow_module_level=True)

Run = Callable[..., str]


def test_producer_and_simple_consumer_send_receive_ack_once(run_driver: Run) -> None:
    result = json.loads(run_driver("send_receive", "compat_basic", "g_basic"))
    assert result == {"sent": 30, "received": 30}


def test_change_invisibility_and_unacked_message_come_back_with_attempt_2(run_driver: Run) -> None:
    result = json.loads(run_driver("redelivery", "compat_redeliver", "g_redeliver"))
    assert result["unacked_returned_after_s"] >= 2


def test_empty_long_poll_returns_no_messages_after_about_the_polling_time(run_driver: Run) -> None:
    result = json.loads(run_driver("empty_poll", "compat_empty", "g_empty"))
    assert 2 <= result["empty_poll_s"] <= 5


def test_garbage_receipt_handle_and_oversized_body_are_errors(run_driver: Run) -> None:
    result = json.loads(run_driver("errors", "compat_errors", "g_errors"))
    assert result["garbage_ack"] == 40013  # INVALID_RECEIPT_HANDLE
    assert result["oversized_server"] == 41301  # MESSAGE_BODY_TOO_LARGE


def test_push_consumer_consumes_100_messages(run_driver: Run) -> None:
    result = json.loads(run_driver("push", "compat_push", "g_push"))
    assert result["consumed"] == 100
