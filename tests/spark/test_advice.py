"""The adaptive threshold's rule (spark_metrics/advice.py, docs/SPARK.md "The adaptive switch") on synthetic
evidence, no Spark: a busy group that herds in notify pulls the threshold below its rate, a sparse group with
false empties in long polling pushes it above its rate."""

from __future__ import annotations

import tomllib

import pytest

from spark_metrics.advice import (
    FALSE_EMPTY,
    HERD,
    NOTIFY_OK,
    Evidence,
    GroupAdvice,
    for_fleet,
    for_group,
    fragment,
)
from tests.spark.test_health import START


def busy(rate: float, windows: int = 10) -> list[Evidence]:
    """Notify with 12 broker calls per delivered message over 3 brokers: a herd."""
    return [Evidence(rate, 12.0, 1.0, 0.0, 3, lost_races=rate * 60) for _ in range(windows)]


def sparse(rate: float, windows: int = 10) -> list[Evidence]:
    """Long polling with false empties."""
    return [Evidence(rate, 1.5, 0.0, 12.0, 3) for _ in range(windows)]


def test_verdicts() -> None:
    assert Evidence(40, 12.0, 0.9, 0, 3, lost_races=100).verdict == HERD
    assert Evidence(40, 5.0, 0.9, 0, 3, lost_races=100).verdict == NOTIFY_OK  # a lone notify receive: brokers + 2
    # a lone consumer whose receives often end empty pays more per message, but races nobody: not a herd
    assert Evidence(0.2, 7.5, 1.0, 0, 3, lost_races=0).verdict == NOTIFY_OK
    assert Evidence(1, 1.0, 0.1, 4, 3).verdict == FALSE_EMPTY
    assert Evidence(1, 1.0, 0.1, 0, 3).verdict is None  # long polling that missed nothing says nothing
    assert Evidence(1, None, 0.9, 0, 3).verdict is None  # nothing delivered: no cost per message


def test_a_busy_group_wants_long_polling_below_its_rate_and_a_sparse_one_notify_above_its_rate() -> None:
    b, s = for_group("busy", busy(40)), for_group("sparse", sparse(0.5))
    assert 0 < b.threshold < 40 and b.at_most == b.threshold  # its receives would all long-poll
    assert s.threshold == 0 and s.at_least is not None and s.at_least > 0.5  # never long-poll it by rate
    fleet = for_fleet([b, s], proxies=1)
    assert s.at_least < fleet.rate_threshold < b.at_most


@pytest.mark.parametrize("rate", [10.0, 40.0, 160.0])
def test_the_threshold_follows_the_busy_groups_rate(rate: float) -> None:
    """A busier herding group moves its threshold up with it, always below its rate."""
    lower = for_fleet([for_group("busy", busy(rate / 2)), for_group("sparse", sparse(0.5))], proxies=1)
    higher = for_fleet([for_group("busy", busy(rate)), for_group("sparse", sparse(0.5))], proxies=1)
    assert lower.rate_threshold < higher.rate_threshold < rate


def test_a_busier_sparse_group_pushes_the_threshold_up_until_no_rate_serves_both() -> None:
    quiet = for_fleet([for_group("busy", busy(40)), for_group("sparse", sparse(0.5))], proxies=1)
    livelier = for_fleet([for_group("busy", busy(40)), for_group("sparse", sparse(8))], proxies=1)
    assert quiet.rate_threshold < livelier.rate_threshold
    assert livelier.rate_threshold > 1.25 * 8 * 0.99  # still above where notify was right for it
    crossed = for_fleet([for_group("busy", busy(40)), for_group("sparse", sparse(30))], proxies=1)
    assert crossed.rate_threshold == 0 and "no one rate" in crossed.why


def test_without_a_herd_the_rate_criterion_stays_off() -> None:
    fleet = for_fleet([for_group("sparse", sparse(0.5)), for_group("ok", [Evidence(5, 2.0, 1.0, 0, 3)] * 4)], proxies=2)
    assert fleet.rate_threshold == 0 and fleet.proxies == 2


def test_the_fragment_is_toml_with_the_proxys_keys_and_the_evidence_as_comments() -> None:
    groups: list[GroupAdvice] = [for_group("busy", busy(40)), for_group("sparse", sparse(0.5))]
    text = fragment(for_fleet(groups, proxies=3), first=START, last=START)
    settings = tomllib.loads(text)
    assert set(settings) == {"adaptive_rate_threshold", "adaptive_proxies"}
    assert settings["adaptive_proxies"] == 3 and 0.5 < settings["adaptive_rate_threshold"] < 40
    evidence = {line.split()[1] for line in text.splitlines() if line.startswith("# ") and len(line.split()) > 2}
    assert {"busy", "sparse"} <= evidence
