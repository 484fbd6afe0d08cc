"""A client's knowledge that its proxy serves none of an extension lasts a minute, then the next call asks again."""

from __future__ import annotations

import logging

import pytest

from popgate import _served
from popgate._served import RECHECK_S, Served


class Client:
    extension = Served()


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    clock = [1000.0]
    monkeypatch.setattr(_served, "clock", lambda: clock[0])
    return clock


def test_not_served_holds_until_the_recheck_then_reads_unknown(now: list[float]) -> None:
    client = Client()
    assert client.extension is None and not Client.extension.refused_before(client)
    client.extension = False
    now[0] += RECHECK_S - 0.1
    assert client.extension is False
    now[0] += 0.1
    assert client.extension is None  # the next call asks again
    assert Client.extension.refused_before(client)


def test_served_stays_served_and_each_client_keeps_its_own(now: list[float]) -> None:
    served, refused = Client(), Client()
    served.extension, refused.extension = True, False
    now[0] += 10 * RECHECK_S
    assert served.extension is True and not Client.extension.refused_before(served)
    refused.extension = False  # asked again and refused again: another minute
    now[0] += RECHECK_S / 2
    assert refused.extension is False


def test_the_switch_to_v2_is_logged_once_then_at_debug(now: list[float], caplog: pytest.LogCaptureFixture) -> None:
    from popgate import SimpleConsumer

    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    try:
        with caplog.at_level(logging.DEBUG, logger="popgate"):
            consumer._not_served("_batch_receive", "%s serves no %s: using v2", "batch receive")
            now[0] += RECHECK_S
            consumer._not_served("_batch_receive", "%s serves no %s: using v2", "batch receive")
        levels = [r.levelno for r in caplog.records if "serves no batch receive" in r.getMessage()]
        assert levels == [logging.INFO, logging.DEBUG]
    finally:
        consumer.close()


def test_after_the_minute_one_caller_asks_again_and_the_others_keep_v2(now: list[float]) -> None:
    client = Client()
    client.extension = False
    now[0] += RECHECK_S
    assert [client.extension for _ in range(3)] == [None, False, False]  # many calls at once: one asks
    now[0] += RECHECK_S  # that one's answer lost (a timeout): the next minute another asks
    assert client.extension is None


def test_a_switch_back_to_v2_after_the_extension_was_served_is_logged_at_info(now: list[float]) -> None:
    client = Client()
    client.extension = False
    assert Client.extension.refused_before(client)
    client.extension = True  # the proxies upgraded
    assert not Client.extension.refused_before(client)
    client.extension = False  # one rolled back
    assert Client.extension.refused_before(client)


def test_a_planning_read_leaves_the_ask_to_the_call(now: list[float]) -> None:
    client = Client()
    client.extension = False
    now[0] += RECHECK_S
    assert Client.extension.peek(client) is None and Client.extension.peek(client) is None
    assert client.extension is None  # the call's own read asks
    assert Client.extension.peek(client) is False and client.extension is False
