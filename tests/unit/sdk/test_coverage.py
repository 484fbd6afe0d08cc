"""`popgate stats` names every broker its figures leave out (popgate.cli.admin.Coverage)."""

from __future__ import annotations

from popgate.cli.admin import BROKERS_MISSING, Coverage


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
