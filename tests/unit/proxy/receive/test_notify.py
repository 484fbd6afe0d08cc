"""The pop-with-notify state machine alone: events in, commands out, no sockets, no event loop."""

from __future__ import annotations

from popgate_contract.errors import BadRequest, BrokerTimeout, BrokerUnavailable, TooManyRequests, TopicNotFound
from proxy.receive.notify import NotifyRun
from proxy.receive.notify_commands import AwaitUp, Cancel, Finish, Notify, PassOn, Pop, Rewatch
from tests.unit.proxy.receive.notify_runs import BROKERS, finish, message, notifying, started


def test_first_pop_goes_to_one_broker_and_a_hit_answers_without_notifying() -> None:
    run, cmds = started()
    assert cmds == [Pop("b1")]
    done = finish(run.popped("b1", message("m1"), polling_full=False, now=0.001))
    assert done.outcome == "messages" and [m.stored.message.message_id for m in done.messages] == ["m1"]
    assert run.stats.first_pop_hit and run.stats.notifications == 0


def test_empty_first_pop_notifies_every_broker_with_the_poll_time_left() -> None:
    run, _ = started(poll_end=5.0)
    assert run.popped("b1", [], polling_full=False, now=1.5) == [Notify(b, 3500) for b in BROKERS]


def test_has_message_pops_that_broker_then_answers_and_cancels_the_other_notifications() -> None:
    run = notifying()
    assert run.notified("b2", has_message=True, polling_full=False, now=1.0) == [Pop("b2")]
    cmds = run.popped("b2", message("m2"), polling_full=False, now=1.001)
    assert cmds[:-1] == [Cancel("b1"), Cancel("b3")]
    assert finish(cmds).outcome == "messages"
    assert run.done and run.outstanding == []


def test_a_single_live_broker_holds_a_pop_instead_of_a_notification() -> None:
    run = NotifyRun(("b1",), 5.0)
    assert run.start() == [Pop("b1")]
    assert run.popped("b1", [], polling_full=False, now=1.5) == [Pop("b1", 3500)]
    assert run.stats.held_pop and run.stats.notifications == 0
    done = finish(run.popped("b1", message("m1"), polling_full=False, now=2.0))
    assert done.outcome == "messages" and run.outstanding == []


def test_a_single_live_broker_whose_held_pop_ends_empty_answers_empty() -> None:
    run = NotifyRun(("b1",), 5.0)
    run.start()
    run.popped("b1", [], polling_full=False, now=1.0)
    assert run.poll_over() == []  # the held Pop is waited for
    assert finish(run.popped("b1", [], polling_full=False, now=5.0)).outcome == "empty"


def test_one_consume_step_at_a_time_the_second_announcement_waits_in_the_queue() -> None:
    run = notifying()
    assert run.notified("b2", has_message=True, polling_full=False, now=1.0) == [Pop("b2")]
    assert run.notified("b3", has_message=True, polling_full=False, now=1.0) == []  # queued, not popped yet
    assert list(run.ready) == ["b3"]
    # b2's message went to another consumer: b2 is watched again, and b3 is popped next.
    assert run.popped("b2", [], polling_full=False, now=1.01) == [Notify("b2", 8990), Pop("b3")]
    assert run.stats.lost_races == 1
    done = finish(run.popped("b3", message("m3"), polling_full=False, now=1.02))
    assert done.outcome == "messages"


def test_lost_race_renotifies_and_the_next_arrival_is_served() -> None:
    run = notifying()
    run.notified("b2", has_message=True, polling_full=False, now=1.0)
    assert run.popped("b2", [], polling_full=False, now=1.0) == [Notify("b2", 9000)]
    assert not run.done and run.outstanding == ["b1", "b2", "b3"]
    assert run.notified("b2", has_message=True, polling_full=False, now=2.0) == [Pop("b2")]
    assert finish(run.popped("b2", message("m4"), polling_full=False, now=2.0)).outcome == "messages"


def test_end_of_poll_time_answers_empty_and_cancels_every_notification() -> None:
    run = notifying()
    cmds = run.poll_over()
    assert cmds[:-1] == [Cancel(b) for b in BROKERS]
    assert finish(cmds).outcome == "empty" and finish(cmds).error is None
    # each Notification was held until the poll ended with nothing: empty, not unanswered; the run waited
    assert (run.stats.notifications, run.stats.notified_empty, run.stats.waited) == (3, 3, True)
    # a late has_message is not followed (the run is over), but handed back: the broker passes its wake on
    assert run.notified("b1", has_message=True, polling_full=False, now=10.0) == [PassOn("b1")]
    assert run.notified("b2", has_message=False, polling_full=False, now=10.0) == []


def test_end_of_poll_time_waits_for_a_pop_in_flight_so_its_messages_are_not_dropped() -> None:
    run = notifying()
    run.notified("b3", has_message=True, polling_full=False, now=9.999)
    assert run.poll_over() == [Cancel("b1"), Cancel("b2")]
    assert (run.stats.notified_has_message, run.stats.notified_empty) == (1, 2)
    assert finish(run.popped("b3", message("m5"), polling_full=False, now=10.001)).outcome == "messages"


def test_hard_deadline_cancels_even_a_pop_in_flight() -> None:
    run = notifying()
    run.notified("b3", has_message=True, polling_full=False, now=9.999)
    run.poll_over()
    cmds = run.deadline()
    assert cmds == [Cancel("b3"), Finish([], "empty")]


def test_closing_answers_at_once_and_cancels_everything() -> None:
    run = notifying()
    cmds = run.closing()
    assert cmds[:-1] == [Cancel(b) for b in BROKERS] and finish(cmds).outcome == "closing"
    assert run.closing() == []


def test_no_poll_time_left_after_the_first_pop_asks_every_other_broker_once() -> None:
    # A receive that does not wait (or whose first Pop took the poll time): a backlog on another broker is
    # served, not answered empty. The poll's end does not cut the last look short.
    run, _ = started(poll_end=1.0)
    assert run.poll_over() == []  # while the first Pop is out
    assert run.popped("b1", [], polling_full=False, now=1.0) == [Notify("b2", 0), Notify("b3", 0)]
    assert run.poll_over() == []
    assert run.notified("b2", has_message=False, polling_full=False, now=1.001) == []
    assert run.notified("b3", has_message=True, polling_full=False, now=1.001) == [Pop("b3")]
    assert finish(run.popped("b3", message("m3"), polling_full=False, now=1.002)).outcome == "messages"
    assert not run.stats.waited  # poll-0 looks only: no broker held this receive (not is_long_polling)


def test_the_last_look_answers_empty_once_every_broker_said_nothing() -> None:
    run, _ = started(poll_end=1.0)
    run.popped("b1", [], polling_full=False, now=1.0)
    assert run.notified("b2", has_message=True, polling_full=False, now=1.001) == [Pop("b2")]
    assert run.notified("b3", has_message=False, polling_full=False, now=1.001) == []
    assert run.popped("b2", [], polling_full=False, now=1.002) == [Finish([], "empty")]  # lost the race: done


def test_a_single_broker_with_no_poll_time_left_answers_empty() -> None:
    run = NotifyRun(("b1",), 1.0)
    run.start()
    assert run.popped("b1", [], polling_full=False, now=1.0) == [Finish([], "empty")]


def test_a_broker_down_at_the_start_is_watched_once_it_is_up() -> None:
    run = NotifyRun(("b1", "b2"), 10.0, down=("b3",))
    assert run.start() == [Pop("b1"), AwaitUp("b3")]
    assert run.popped("b1", [], polling_full=False, now=0.0) == [Notify("b1", 10_000), Notify("b2", 10_000)]
    assert run.rewatch("b3", healthy=True, now=4.0) == [Notify("b3", 6_000)]  # back: watched for the time left
    assert run.notified("b3", has_message=True, polling_full=False, now=5.0) == [Pop("b3")]
    assert finish(run.popped("b3", message("m7"), polling_full=False, now=5.0)).outcome == "messages"


def test_a_broker_up_again_during_the_first_pop_is_notified_with_the_others() -> None:
    run = NotifyRun(("b1",), 10.0, down=("b2",))
    run.start()
    assert run.rewatch("b2", healthy=True, now=0.001) == []
    assert run.popped("b1", [], polling_full=False, now=0.002) == [Notify("b1", 9_998), Notify("b2", 9_998)]


def test_an_unreachable_broker_is_left_out_and_the_others_still_serve() -> None:
    run = notifying()
    assert run.failed_call("b1", BrokerUnavailable("b1 down"), now=1.0) == [Rewatch("b1", 2.0)]
    assert run.notified("b2", has_message=True, polling_full=False, now=1.0) == [Pop("b2")]
    assert finish(run.popped("b2", message("m6"), polling_full=False, now=1.0)).outcome == "messages"


def test_first_pop_on_a_dead_broker_goes_on_to_notify_the_others() -> None:
    run, _ = started()
    assert run.failed_call("b1", BrokerUnavailable("down"), now=0.0) == [
        Notify("b2", 10_000),
        Notify("b3", 10_000),
        Rewatch("b1", 1.0),
    ]


def test_a_broker_that_failed_is_watched_again_once_it_is_back() -> None:
    run = notifying()
    assert run.failed_call("b1", BrokerUnavailable("b1 restarting"), now=1.0) == [Rewatch("b1", 2.0)]
    assert run.rewatch("b1", healthy=False, now=2.0) == [AwaitUp("b1")]  # seen down: wait until it is up
    assert run.rewatch("b1", healthy=True, now=3.0) == [Notify("b1", 7_000)]  # back: watched for the time left
    assert run.notified("b1", has_message=True, polling_full=False, now=4.0) == [Pop("b1")]
    assert finish(run.popped("b1", message("m9"), polling_full=False, now=4.0)).outcome == "messages"


def test_rewatches_of_a_broker_failing_while_seen_up_are_bounded_and_end_with_the_run() -> None:
    run = notifying()
    cmds = run.failed_call("b1", BrokerUnavailable("down"), now=0.5)
    for t in range(1, 10):
        if not cmds:
            break
        assert cmds == [Rewatch("b1", t + 0.5)]
        assert run.rewatch("b1", healthy=True, now=t + 0.5) == [Notify("b1", int((9.5 - t) * 1000))]
        cmds = run.failed_call("b1", BrokerUnavailable("down"), now=t + 0.5)
    assert run.rewatches["b1"] == run.max_rewatches
    run.poll_over()
    assert run.rewatch("b1", healthy=True, now=9.0) == []


def test_every_broker_unreachable_is_an_error() -> None:
    run = notifying()
    run.failed_call("b1", BrokerUnavailable("down"), now=1.0)
    run.failed_call("b2", BrokerUnavailable("down"), now=1.0)
    done = finish(run.failed_call("b3", BrokerUnavailable("b3 down"), now=1.0))
    assert isinstance(done.error, BrokerUnavailable) and done.error.message == "b3 down"


def test_every_broker_full_is_too_many_requests() -> None:
    run = notifying()
    for b in BROKERS[:-1]:
        assert run.notified(b, has_message=False, polling_full=True, now=1.0) == []
    done = finish(run.notified("b3", has_message=False, polling_full=True, now=1.0))
    assert isinstance(done.error, TooManyRequests)


def test_a_bad_request_answers_with_its_error_at_once() -> None:
    run, _ = started()
    done = finish(run.failed_call("b1", BadRequest("bad filter"), now=0.0))
    assert isinstance(done.error, BadRequest)


def test_a_broker_without_the_topic_is_left_out_and_none_having_it_is_topic_not_found() -> None:
    run = notifying()
    assert run.failed_call("b1", TopicNotFound("no topic t on b1"), now=1.0) == []
    assert run.notified("b2", has_message=True, polling_full=False, now=1.0) == [Pop("b2")]
    assert finish(run.popped("b2", message("m7"), polling_full=False, now=1.0)).outcome == "messages"
    nowhere, _ = started()
    assert nowhere.failed_call("b1", TopicNotFound("no topic t"), now=0.0) == [
        Notify("b2", 10_000),
        Notify("b3", 10_000),
    ]
    nowhere.failed_call("b2", TopicNotFound("no topic t"), now=0.0)
    done = finish(nowhere.failed_call("b3", TopicNotFound("no topic t on b3"), now=0.0))
    assert isinstance(done.error, TopicNotFound)


def test_a_hold_that_ended_early_is_renewed_and_one_at_the_end_answers_empty() -> None:
    run = notifying()
    assert run.notified("b1", has_message=False, polling_full=False, now=4.0) == [Notify("b1", 6000)]
    assert run.notified("b2", has_message=False, polling_full=False, now=10.0) == []
    assert run.notified("b3", has_message=False, polling_full=False, now=10.0) == []
    assert finish(run.notified("b1", has_message=False, polling_full=False, now=10.0)).outcome == "empty"


def test_no_live_broker_is_unavailable() -> None:
    done = finish(NotifyRun((), 1.0).start())
    assert isinstance(done.error, BrokerUnavailable)


def test_a_zero_poll_time_is_one_pop_whose_hit_still_counts_as_a_first_pop_hit() -> None:
    run = NotifyRun(BROKERS, 0.0)
    assert run.start() == [Pop("b1")]
    assert run.poll_over() == []  # the first Pop is in flight: wait for it
    assert finish(run.popped("b1", message("m8"), polling_full=False, now=0.001)).outcome == "messages"
    assert run.stats.first_pop_hit


def test_a_closing_broker_that_answers_at_once_is_not_notified_in_a_loop() -> None:
    run = notifying(now=0.0)
    assert run.notified("b1", has_message=False, polling_full=False, closing=True, now=0.001) == []  # dropped
    assert "b1" in run.dropped and run.outstanding == ["b2", "b3"]
    run.notified("b2", has_message=False, polling_full=False, closing=True, now=0.001)
    done = finish(run.notified("b3", has_message=False, polling_full=False, closing=True, now=0.001))
    assert done.outcome == "empty" and done.error is None


def test_notifications_a_deletion_ends_at_once_are_made_again_so_the_receive_is_told_topic_not_found() -> None:
    """Answered empty at once without `closing` (the topic deleted): each broker is notified once more and the
    run ends with its TOPIC_NOT_FOUND; a second early empty from a broker drops it, so nothing spins."""
    run = notifying(now=0.0)
    for broker in BROKERS:
        assert run.notified(broker, has_message=False, polling_full=False, now=0.01) == [Notify(broker, 9_990)]
    run.failed_call("b1", TopicNotFound("no topic t on b1"), now=0.02)
    run.failed_call("b2", TopicNotFound("no topic t on b2"), now=0.02)
    assert isinstance(finish(run.failed_call("b3", TopicNotFound("no topic t on b3"), now=0.02)).error, TopicNotFound)
    again = notifying(now=0.0)
    again.notified("b1", has_message=False, polling_full=False, now=0.01)
    assert again.notified("b1", has_message=False, polling_full=False, now=0.02) == [] and "b1" in again.dropped


def test_a_broker_whose_announcements_no_pop_can_serve_stops_being_watched() -> None:
    run = NotifyRun(BROKERS, 10.0, max_lost_per_broker=3)
    run.start()
    run.popped("b1", [], polling_full=False, now=0.0)
    for i in range(3):
        assert run.notified("b2", has_message=True, polling_full=False, now=0.1 * i) == [Pop("b2")]
        cmds = run.popped("b2", [], polling_full=False, now=0.1 * i)
    assert cmds == [] and "b2" in run.dropped and run.outstanding == ["b1", "b3"]


def test_a_held_pop_the_broker_could_not_hold_is_too_many_requests_not_an_instant_empty() -> None:
    run = NotifyRun(("b1",), 5.0)
    run.start()
    assert run.popped("b1", [], polling_full=False, now=1.0) == [Pop("b1", 4000)]
    done = finish(run.popped("b1", [], polling_full=True, now=1.001))
    assert isinstance(done.error, TooManyRequests)  # the client backs off instead of polling again at once


def test_a_held_pop_that_fails_answers_its_error() -> None:
    run = NotifyRun(("b1",), 5.0)
    run.start()
    run.popped("b1", [], polling_full=False, now=1.0)
    done = finish(run.failed_call("b1", TooManyRequests("session busy"), now=1.001))
    assert done.outcome == "error" and isinstance(done.error, TooManyRequests)


def test_announced_messages_a_run_answered_without_are_handed_back_for_other_consumers() -> None:
    """One arrival wakes one held request: b2's message woke this run's Notification, and the run was answered
    from b1. Handed back, b2 wakes the next consumer held there (it waited for the 1 s sweep, or a whole poll)."""
    run = notifying()
    run.notified("b1", has_message=True, polling_full=False, now=1.0)  # popping b1
    assert run.notified("b2", has_message=True, polling_full=False, now=1.0) == []  # queued: one Pop at a time
    cmds = run.popped("b1", message("m1"), polling_full=False, now=1.001)
    assert cmds[:-1] == [Cancel("b3"), PassOn("b2")]
    assert finish(cmds).outcome == "messages"


def test_a_broker_refusing_the_group_makes_a_run_that_finds_nothing_too_many_requests() -> None:
    """A broker at its --max-groups refuses a new group: its messages are out of reach for that group. The run
    ended "empty" — "no new message" for good, no error anywhere (a review's probe) — where longpoll passes the
    refusal on. A message from another broker still answers; the refusal is forgotten once that broker answers."""
    refused = TooManyRequests("broker b2 keeps state for 3 consumer groups and topics")
    run = notifying()
    run.failed_call("b2", refused, now=1.0)
    run.notified("b1", has_message=False, polling_full=False, now=10.0)
    done = finish(run.notified("b3", has_message=False, polling_full=False, now=10.0))
    assert done.outcome == "error" and done.error is refused

    run = notifying()
    run.failed_call("b2", refused, now=1.0)
    run.notified("b1", has_message=True, polling_full=False, now=2.0)
    assert finish(run.popped("b1", message("m1"), polling_full=False, now=2.001)).outcome == "messages"

    run = notifying()
    [rewatch] = [c for c in run.failed_call("b2", refused, now=1.0) if isinstance(c, Rewatch)]
    assert run.rewatch("b2", healthy=True, now=rewatch.at) == [Notify("b2", 8000)]
    run.notified("b2", has_message=False, polling_full=False, now=10.0)
    run.notified("b1", has_message=False, polling_full=False, now=10.0)
    assert finish(run.notified("b3", has_message=False, polling_full=False, now=10.0)).outcome == "empty"


def test_a_run_waits_for_a_failed_broker_to_be_looked_at_again() -> None:
    """b2 and b3 closing answer their Notifications at once while b1, failed, is to be looked at again: the run
    waits for b1 (restarted, with a message stored meanwhile) rather than answering empty with poll time left."""
    run, _ = started()
    run.popped("b1", [], polling_full=False, now=1.0)
    assert run.failed_call("b1", BrokerUnavailable("b1 restarting"), now=1.0) == [Rewatch("b1", 2.0)]
    run.notified("b2", has_message=False, polling_full=False, closing=True, now=1.01)  # answered without holding
    assert run.notified("b3", has_message=False, polling_full=False, closing=True, now=1.01) == []  # b1 is to come
    assert run.rewatch("b1", healthy=False, now=2.0) == [AwaitUp("b1")]
    assert run.rewatch("b1", healthy=True, now=3.0) == [Notify("b1", 7_000)]  # back, a message stored meanwhile
    assert run.notified("b1", has_message=True, polling_full=False, now=3.5) == [Pop("b1")]
    assert finish(run.popped("b1", message("m5"), polling_full=False, now=3.5)).outcome == "messages"
    down, _ = started()
    down.popped("b1", [], polling_full=False, now=1.0)
    down.failed_call("b1", BrokerUnavailable("b1 restarting"), now=1.0)
    down.notified("b2", has_message=False, polling_full=False, closing=True, now=1.01)
    down.notified("b3", has_message=False, polling_full=False, closing=True, now=1.01)
    assert finish(down.poll_over()).outcome == "empty"  # never back: empty at the poll's end, not before


def test_a_lone_broker_that_times_out_a_pop_is_looked_at_again_and_the_long_poll_is_never_its_error() -> None:
    """A Pop that does not wait has a short timeout (IMMEDIATE_TIMEOUT_S) that a broker still passing its health
    checks misses under a burst of receives: outcome unknown, the broker not down. With no other broker to watch,
    the run goes on at that broker after the rewatch delay and is at worst empty at the poll's end — never answered
    the timeout (PROXY_TIMEOUT), which the client reads as a failure."""
    run = NotifyRun(("b1",), 10.0)
    run.start()
    assert run.failed_call("b1", BrokerTimeout("broker b1 did not answer in time"), now=0.5) == [Rewatch("b1", 1.5)]
    assert not run.done
    assert run.rewatch("b1", healthy=True, now=1.5) == [Notify("b1", 8500)]
    assert run.notified("b1", has_message=True, polling_full=False, now=2.0) == [Pop("b1")]
    assert finish(run.popped("b1", message("m1"), polling_full=False, now=2.0)).outcome == "messages"

    short = NotifyRun(("b1",), 1.2)  # too little poll time left for a rewatch: empty at the poll's end
    short.start()
    assert short.failed_call("b1", BrokerTimeout("broker b1 did not answer in time"), now=0.5) == []
    assert finish(short.poll_over()).outcome == "empty"

    hung = NotifyRun(("b1",), 10.0)  # hung: its health checks see it down, and nothing comes back by the poll's end
    hung.start()
    hung.failed_call("b1", BrokerTimeout("broker b1 did not answer in time"), now=0.5)
    assert hung.rewatch("b1", healthy=False, now=1.5) == [AwaitUp("b1")]
    assert finish(hung.poll_over()).outcome == "empty"


def test_a_lone_broker_timing_out_past_its_rewatches_is_the_runs_error_not_an_idle_wait() -> None:
    """Once the run's rewatches of a broker that keeps timing out are used up, nothing will look at it again: the
    run answers the timeout at once (the client retries) rather than idle to the poll's end with nothing in flight
    while the broker may hold a message."""
    run = NotifyRun(("b1",), 30.0)
    assert run.start() == [Pop("b1")]
    now = 0.5
    for _ in range(run.max_rewatches):
        assert run.failed_call("b1", BrokerTimeout("broker b1 did not answer in time"), now=now) == [
            Rewatch("b1", now + run.rewatch_s)
        ]
        now += run.rewatch_s
        assert run.rewatch("b1", healthy=True, now=now) == [Notify("b1", int((30.0 - now) * 1000))]
        assert run.notified("b1", has_message=True, polling_full=False, now=now) == [Pop("b1")]
        now += 0.5
    answer = finish(run.failed_call("b1", BrokerTimeout("broker b1 did not answer in time"), now=now))
    assert (answer.outcome, type(answer.error)) == ("error", BrokerTimeout)
