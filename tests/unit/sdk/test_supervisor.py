"""`popgate up`'s restart policy (popgate.cli.supervisor.Supervision) and restart arguments, without processes."""

from __future__ import annotations

from popgate.cli.cluster import pinned
from popgate.cli.supervisor import Backoff, State, Supervision, describe

BACKOFF = Backoff(first_s=0.5, max_s=4.0, stable_s=10.0, max_failures=5)


def test_a_child_that_dies_is_restarted_after_a_growing_bounded_backoff() -> None:
    policy = Supervision(BACKOFF)
    policy.ready("b1", at=0.0)
    delays = []
    at = 1.0
    for _ in range(5):  # each one dies a second after it was ready: never stable
        delay = policy.died("b1", at)
        assert delay is not None
        delays.append(delay)
        assert policy.due(at + delay - 0.01) == [] and policy.due(at + delay) == ["b1"]
        policy.starting("b1")
        policy.ready("b1", at + delay)
        at += delay + 1.0
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0]  # doubled, then capped at max_s
    assert policy.children["b1"].restarts == 5
    assert policy.died("b1", at) is None  # the 6th failure in a row: given up
    assert policy.children["b1"].state is State.GAVE_UP


def test_a_child_that_stayed_up_starts_its_backoff_again() -> None:
    policy = Supervision(BACKOFF)
    policy.ready("b1", at=0.0)
    assert policy.died("b1", 1.0) == 0.5
    policy.starting("b1")
    policy.ready("b1", 1.5)
    assert policy.died("b1", 2.0) == 1.0  # up 0.5 s: the second failure in a row
    policy.starting("b1")
    policy.ready("b1", 3.0)
    assert policy.died("b1", 13.0) == 0.5  # up 10 s: stable, the count starts again


def test_a_restart_that_never_becomes_ready_counts_as_a_failure() -> None:
    policy = Supervision(Backoff(first_s=1.0, max_s=8.0, max_failures=2))
    policy.ready("proxy", at=0.0)
    assert policy.died("proxy", 20.0) == 1.0
    policy.starting("proxy")
    assert policy.start_failed("proxy", 22.0) == 2.0
    assert policy.children["proxy"].state is State.WAITING and policy.next_due() == 24.0
    policy.starting("proxy")
    assert policy.start_failed("proxy", 25.0) is None
    assert policy.children["proxy"].restarts == 0  # none reached ready


def test_no_restart_gives_a_child_up_at_its_first_death() -> None:
    policy = Supervision(Backoff(max_failures=0))  # `popgate up --no-restart`
    policy.ready("b1", at=0.0)
    assert policy.died("b1", 100.0) is None


def test_the_soonest_restart_is_due_first_and_others_wait() -> None:
    policy = Supervision(BACKOFF)
    for name in ("b1", "b2", "proxy"):
        policy.ready(name, at=0.0)
    policy.died("b2", 1.0)
    policy.died("b1", 1.2)
    assert policy.next_due() == 1.5 and policy.due(1.7) == ["b2", "b1"] and policy.due(1.6) == ["b2"]


def test_the_live_view_line_tells_state_and_restarts() -> None:
    policy = Supervision(BACKOFF)
    for name in ("b1", "b2", "proxy"):
        policy.ready(name, at=0.0)
    policy.died("b2", 1.0)
    policy.starting("b2")
    policy.ready("b2", 2.0)
    policy.died("b1", 20.0)
    assert describe(policy.view(), now=20.2) == "b1 restarting in 0.3s  b2 up (1 restart)  proxy up"


def test_a_restart_pins_the_addresses_the_child_had() -> None:
    argv = ["py", "-m", "proxy", "--listen", "127.0.0.1:0", "--metrics-listen=127.0.0.1:0", "--broker", "b1=h:1"]
    once = pinned(argv, "--listen", "127.0.0.1:8081")
    assert pinned(once, "--metrics-listen", "127.0.0.1:9100") == [
        *["py", "-m", "proxy", "--listen", "127.0.0.1:8081", "--metrics-listen=127.0.0.1:9100"],
        *["--broker", "b1=h:1"],
    ]
    # The metrics address came from the inherited POPGATE_METRICS_LISTEN: a flag, which wins, is added.
    assert pinned(["py", "-m", "broker"], "--metrics-listen", "127.0.0.1:9101")[-2:] == [
        "--metrics-listen",
        "127.0.0.1:9101",
    ]
