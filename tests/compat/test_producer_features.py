"""The official rocketmq-python-client 5.1.2's producer features, in a subprocess, against `popgate up --brokers 3`:
priority, recall and transactions (issue 29)."""

from __future__ import annotations

import json
from collections.abc import Callable

Run = Callable[..., str]


def test_priority_messages_come_highest_first_within_each_queue(run_driver: Run) -> None:
    result = json.loads(run_driver("priority", "compat_priority", "g_priority"))
    assert result["received"] == 48 and result["queues"] > 1


def test_a_recalled_delay_message_is_never_delivered_and_bad_recalls_are_clear_errors(run_driver: Run) -> None:
    result = json.loads(run_driver("recall", "compat_recall", "g_recall"))
    assert result == {"recall_again": 40400, "garbage": 40000, "delivered": 40400}  # NOT_FOUND, BAD_REQUEST
