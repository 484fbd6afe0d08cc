"""`popgate stats` names every broker its figures leave out (popgate.cli.admin.Coverage)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate.cli.admin import BROKERS_MISSING, Coverage
from popgate.cli.main import main
from popgate.cli.options import NothingListens


def test_every_broker_answered_and_the_proxy_knows_no_other() -> None:
    coverage = Coverage.of(["b1", "b2"], {}, {"b1", "b2"})
    assert (coverage.missing, coverage.answered, coverage.known, coverage.explain()) == ([], 2, 2, [])


def test_a_broker_that_did_not_answer_is_missing() -> None:
    coverage = Coverage.of(["b1", "b2", "b3"], {"b3": "DEADLINE_EXCEEDED"}, None)
    assert coverage.missing == ["b3"] and coverage.answered == 2
    assert coverage.explain() == [
        f"1 of 3 brokers missing: b3; the figures leave them out (exit code {BROKERS_MISSING})"
    ]


def test_brokers_the_proxy_routes_to_but_were_not_given_are_missing_too() -> None:
    """Given one broker of three, `stats` printed "(1 of 1 brokers)": the proxy names the other two."""
    coverage = Coverage.of(["b1"], {}, {"b1", "b2", "b3"})
    assert coverage.missing == ["b2", "b3"] and (coverage.answered, coverage.known) == (1, 3)
    assert coverage.explain()[0] == (
        "broker b2: the proxy routes to it, but its address was not given (--broker b2=HOST:PORT)"
    )
    assert coverage.explain()[-1].startswith("2 of 3 brokers missing: b2, b3;")


def test_a_given_broker_the_proxy_sees_down_is_missing_only_if_it_did_not_answer() -> None:
    # The proxy routes only to live brokers: b2 down there, but it answered us, so its figures are in.
    assert Coverage.of(["b1", "b2"], {}, {"b1"}).missing == []
    assert BROKERS_MISSING == 75  # sysexits EX_TEMPFAIL, documented in docs/SDK.md


def test_brokers_that_answered_are_shown_when_the_proxy_to_check_against_is_gone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """POPGATE_ENDPOINT set for the other commands, its proxy stopped: `stats --broker` still prints the figures,
    says it could not check the list, and exits 75 rather than 69."""

    def fetch(brokers: Any, request: Any, timeout: float, *, failures: dict[str, Any]) -> Any:
        return {"b1": bpb.StatsResponse(broker="b1", queues=[bpb.QueueStats(topic="t", max_offset=2)])}

    def nothing_there(endpoint: str, timeout_s: float = 3.0) -> None:
        raise NothingListens(f"nothing listens at {endpoint} (connection refused)")

    monkeypatch.setattr("popgate.cli.admin.fetch_stats", fetch)
    monkeypatch.setattr("popgate.cli.proxy_admin.check_listening", nothing_there)
    monkeypatch.setenv("POPGATE_ENDPOINT", "127.0.0.1:9")
    assert main(["stats", "--broker", "b1=h:1", "--json"]) == BROKERS_MISSING
    captured = capsys.readouterr()
    assert json.loads(captured.out)["topics"] == [{"topic": "t", "messages": 2}]
    assert "popgate stats: nothing listens at 127.0.0.1:9 (connection refused)" in captured.err


def test_a_broker_that_left_groups_out_of_its_answer_is_named_and_the_exit_code_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broker's Stats is cut to fit its gRPC message limit: the figures shown leave groups out, never silently."""

    def fetch(brokers: Any, request: Any, timeout: float, *, failures: dict[str, Any]) -> Any:
        group = bpb.GroupQueueStats(topic="t", group="g", lag=3)
        return {
            "b1": bpb.StatsResponse(broker="b1", groups=[group], cut=True),
            "b2": bpb.StatsResponse(broker="b2", groups=[group]),
        }

    monkeypatch.setattr("popgate.cli.admin.fetch_stats", fetch)
    monkeypatch.delenv("POPGATE_ENDPOINT", raising=False)
    assert main(["stats", "--broker", "b1=h:1", "--broker", "b2=h:2", "--json"]) == BROKERS_MISSING
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["brokers"]["cut"] == ["b1"] and document["groups"][0]["lag"] == 6
    assert "popgate stats: broker b1 left groups out of its answer" in captured.err
