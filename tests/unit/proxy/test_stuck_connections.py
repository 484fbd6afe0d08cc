"""When the proxy makes a broker's connection again: its health checks time out on a connection its channel says
is up (proxy.health.StuckConnections)."""

from __future__ import annotations

from proxy.health import StuckConnections


def checks(stuck: StuckConnections, outcomes: str, name: str = "b1") -> str:
    """Feeds outcomes (`s`: timed out while connected, `f`: failed otherwise, `p`: passed); a `R` for each one
    after which the connection is to be made again, `.` otherwise."""
    return "".join(
        "R" if stuck.checked(name, passed=outcome == "p", stuck=outcome == "s") else "." for outcome in outcomes
    )


def test_a_connection_whose_checks_time_out_three_times_in_a_row_is_made_again() -> None:
    assert checks(StuckConnections(after=3), "ss") == ".."
    assert checks(StuckConnections(after=3), "sss") == "..R"


def test_checks_that_fail_otherwise_or_pass_break_the_run() -> None:
    # refused, NOT_SERVING, or the channel not connected (a dead or hung broker): a new connection would not help
    assert checks(StuckConnections(after=3), "ssfssps") == "......."


def test_a_connection_made_again_that_times_out_again_waits_twice_as_long_up_to_a_limit() -> None:
    stuck = StuckConnections(after=3, most=12)
    assert checks(stuck, "sss" + "ssssss" + "s" * 12 + "s" * 12) == "..R" + ".....R" + "." * 11 + "R" + "." * 11 + "R"


def test_a_passing_check_resets_the_wait_and_brokers_are_counted_apart() -> None:
    stuck = StuckConnections(after=2)
    assert checks(stuck, "ss") == ".R"
    assert checks(stuck, "ssss") == "...R"
    assert checks(stuck, "pss") == "..R"
    assert checks(stuck, "s", name="b2") == "."
