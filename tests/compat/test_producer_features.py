"""The official rocketmq-python-client 5.1.2's producer features, in a subprocess, against `popgate up --brokers 3`:
priority, recall and transactions (issue 29)."""

from __future__ import annotations

import json
from collections.abc import Callable

Run = Callable[..., str]


def test_priority_messages_come_highest_first_within_each_queue(run_driver: Run) -> None:
    result = json.loads(run_driver("priority", "compat_priority", "g_priority"))
    assert result["received"] == 48 and result["queues"] > 1
