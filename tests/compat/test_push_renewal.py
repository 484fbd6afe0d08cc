"""The official PushConsumer against a backlog it consumes slower than the invisible time: the proxy renews its
auto_renew messages (proxy/renewal.py), so each is consumed once and every ack succeeds.

The module's cluster runs the proxy with a 10 s default invisible time (the least it allows) so that a backlog of
~25 s shows what a 60 s one does to a slower consumer: before renewal (main at 3916db7), 400 messages gave 888
deliveries, 488 of them redeliveries (attempt 2 and more), and 1,112 ack errors ("40013 ... stale", "invalid receipt
handle") in the client's log.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

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
