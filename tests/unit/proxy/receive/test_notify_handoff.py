"""The pop-with-notify state machine handing a busy group's run off to one held Pop: events in, commands out."""

from __future__ import annotations

from proxy.receive.notify_commands import Cancel, Notify, PassOn, Pop, Rewatch
from tests.unit.proxy.receive.notify_runs import finish, message, notifying


def test_a_lost_race_in_a_busy_group_hands_off_to_a_long_poll_on_that_broker() -> None:
    run = notifying()
    run.notified("b2", has_message=True, polling_full=False, now=1.0)
    cmds = run.popped("b2", [], polling_full=False, now=2.0, busy=True)
    assert cmds == [Cancel("b1"), Cancel("b3"), Pop("b2", 8000)]
    assert run.stats.handoff and run.outstanding == ["b2"]
    assert run.notified("b1", has_message=True, polling_full=False, now=2.0) == [PassOn("b1")]  # cancelled: unused
    assert finish(run.popped("b2", message("m7"), polling_full=False, now=3.0)).outcome == "messages"


def test_a_handed_off_long_poll_that_ends_empty_answers_empty() -> None:
    run = notifying()
    run.notified("b2", has_message=True, polling_full=False, now=1.0)
    run.popped("b2", [], polling_full=False, now=1.0, busy=True)
    assert run.poll_over() == []  # the held Pop answers at its own end
    assert finish(run.popped("b2", [], polling_full=False, now=10.0)).outcome == "empty"


def test_a_handed_off_pop_whose_broker_is_stopping_watches_the_other_brokers_for_the_time_left() -> None:
    """The hand-off's broker is stopping (it answers what it holds at once, empty, saying `closing`) with poll time
    left: the other brokers are watched for the time left and the stopping one looked at again later, as a long
    poll goes on at the next broker; with no time left the run answers empty."""
    run = notifying()
    run.notified("b2", has_message=True, polling_full=False, now=1.0)
    run.popped("b2", [], polling_full=False, now=2.0, busy=True)  # handed off: a held Pop at b2
    cmds = run.popped("b2", [], polling_full=False, closing=True, now=2.5)
    assert cmds == [Notify("b1", 7500), Notify("b3", 7500), Rewatch("b2", 3.5)]
    assert run.notified("b3", has_message=True, polling_full=False, now=3.0) == [Pop("b3")]
    assert finish(run.popped("b3", message("m1"), polling_full=False, now=3.0)).outcome == "messages"
    late = notifying()
    late.notified("b2", has_message=True, polling_full=False, now=1.0)
    late.popped("b2", [], polling_full=False, now=2.0, busy=True)
    assert finish(late.popped("b2", [], polling_full=False, closing=True, now=10.0)).outcome == "empty"


def test_announced_messages_are_handed_back_at_the_end_of_the_poll_and_on_a_handoff() -> None:
    run = notifying()
    run.notified("b1", has_message=True, polling_full=False, now=9.0)  # popping b1
    run.notified("b2", has_message=True, polling_full=False, now=9.0)
    assert run.poll_over() == [Cancel("b3"), PassOn("b2")]  # draining the Pop in flight; b2 not popped now
    busy = notifying()
    busy.notified("b1", has_message=True, polling_full=False, now=1.0)
    busy.notified("b2", has_message=True, polling_full=False, now=1.0)
    assert busy.popped("b1", [], polling_full=False, now=1.0, busy=True) == [
        Cancel("b3"),
        PassOn("b2"),
        Pop("b1", 9000),
    ]


def test_a_handed_off_pop_moved_to_another_broker_pops_there_for_the_time_left() -> None:
    run = notifying()
    run.notified("b2", has_message=True, polling_full=False, now=1.0)
    run.popped("b2", [], polling_full=False, now=2.0, busy=True)  # handed off: a held Pop at b2
    assert run.moved("b2", "b3", now=4.0) == [Pop("b3", 6000)]
    assert run.outstanding == ["b3"] and run.moved("b2", "b1", now=4.0) == []  # only the Pop in flight moves
    assert finish(run.popped("b3", message("m9"), polling_full=False, now=4.1)).outcome == "messages"


def test_a_handed_off_pop_moved_after_the_poll_ended_pops_there_at_once_and_ends_the_run() -> None:
    """The poll ended while the handed-off Pop was still held (the broker's clock ends it a moment later), then a
    message elsewhere moved it: the run Pops there with no wait and answers with what that Pop finds, rather than
    waiting for its hard deadline with the wake that moved it used up."""
    run = notifying()
    run.notified("b2", has_message=True, polling_full=False, now=1.0)
    run.popped("b2", [], polling_full=False, now=2.0, busy=True)  # handed off: a held Pop at b2
    assert run.poll_over() == []  # draining: the Pop in flight ends the run
    assert run.moved("b2", "b3", now=10.01) == [Pop("b3", 0)]
    assert run.outstanding == ["b3"]
    assert finish(run.popped("b3", message("m9"), polling_full=False, now=10.02)).outcome == "messages"
