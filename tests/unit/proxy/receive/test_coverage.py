"""Covered long polls alone: where a group's Pops are held, which brokers a Notification watches, which Pop moves.
Events in, commands out; no sockets, no event loop."""

from __future__ import annotations

from proxy.receive.coverage import (
    COVER_DELAY_S,
    WATCH_MIN_S,
    WATCH_RETRY_S,
    Answer,
    AwaitUp,
    Command,
    Coverage,
    CoverLater,
    Held,
    Key,
    Move,
    PassOn,
    Unawait,
    Unwatch,
    Watch,
)

KEY = ("t", "g", "a||b")  # (topic, group, filter)
BROKERS = ("b1", "b2", "b3")


class Call:
    """A held Pop's call: answered (`done`) or still waiting."""

    def __init__(self) -> None:
        self.answered = False

    def done(self) -> bool:
        return self.answered

    def cancel(self) -> bool:
        return not self.answered


def coverage(*, cover: bool = True, health: dict[str, bool] | None = None) -> Coverage:
    """Over BROKERS, each up unless `health` says otherwise (read at each event, as the pool's)."""
    seen = health if health is not None else {}
    return Coverage(lambda: ((name, seen.get(name, True)) for name in BROKERS), cover=cover)


def watches(commands: list[Command]) -> dict[str, Watch]:
    return {c.broker: c for c in commands if isinstance(c, Watch)}


def track(
    cov: Coverage, broker: str, *, now: float = 0.0, key: Key = KEY, call: Call | None = None
) -> tuple[Held, list[Command]]:
    return cov.track(key, broker, call or Call(), now=now)


def test_held_pops_are_counted_per_broker_oldest_first_and_plain_long_polls_send_no_command() -> None:
    cov = coverage(cover=False)
    first, cmds = track(cov, "b1")
    second, more = track(cov, "b1")
    third, other = track(cov, "b2")
    assert cmds == more == other == []
    assert {b: list(entries) for b, entries in cov.held(KEY).items()} == {"b1": [first, second], "b2": [third]}
    assert cov.untrack(KEY, "b1", first) == [] and cov.untrack(KEY, "b2", third) == []
    assert list(cov.held(KEY)) == ["b1"]
    assert cov.untrack(KEY, "b1", first) == []  # not tracked any more: ignored
    assert cov.untrack(KEY, "b1", object()) == []
    cov.untrack(KEY, "b1", second)
    assert cov.held(KEY) == {}


def test_the_groups_first_held_pop_watches_every_other_live_broker_with_its_filter() -> None:
    cov = coverage()
    _, cmds = track(cov, "b1", now=5.0)
    assert [(w.key, w.broker, w.filter, w.started) for w in cmds if isinstance(w, Watch)] == [
        (KEY, "b2", "a||b", 5.0),
        (KEY, "b3", "a||b", 5.0),
    ]
    assert len(cmds) == 2
    assert track(cov, "b1")[1] == []  # not the broker's first: nothing changes


def test_a_pop_held_at_a_watched_broker_ends_its_watch() -> None:
    cov = coverage()
    _, cmds = track(cov, "b1")
    b2 = watches(cmds)["b2"]
    assert track(cov, "b2")[1] == [Unwatch(b2)]
    assert not cov.watching(b2) and cov.watching(watches(cmds)["b3"])
    assert cov.watched(b2, Answer.CANCELLED, now=1.0) == []  # the cancelled watch's end changes nothing


def test_a_broker_whose_last_pop_ended_is_watched_after_a_delay() -> None:
    cov = coverage()
    held, cmds = track(cov, "b1")
    other, _ = track(cov, "b2")
    b3 = watches(cmds)["b3"]
    assert cov.untrack(KEY, "b2", other) == [CoverLater(KEY, COVER_DELAY_S)]
    again = cov.cover(KEY, now=1.0)
    assert list(watches(again)) == ["b2"] and len(again) == 1
    b2 = watches(again)["b2"]
    assert cov.untrack(KEY, "b1", held) == [CoverLater(KEY, COVER_DELAY_S)]
    assert set(cov.cover(KEY, now=1.1)) == {Unwatch(b2), Unwatch(b3)}


def test_a_message_at_a_watched_broker_moves_the_oldest_waiting_pop_of_the_broker_holding_the_most() -> None:
    cov = coverage()
    lone, cmds = track(cov, "b1")
    call = Call()
    answered, _ = track(cov, "b2", call=call)
    waiting, _ = track(cov, "b2")
    b3 = watches(cmds)["b3"]
    call.answered = True  # its broker had something: it stays
    assert cov.watched(b3, Answer.HAS_MESSAGE, now=1.0) == [Move(KEY, waiting)]
    assert waiting.moved_to == "b3" and lone.moved_to is None and answered.moved_to is None
    assert not cov.watching(b3)


def test_a_pop_already_moved_is_not_moved_again() -> None:
    cov = coverage()
    first, cmds = track(cov, "b1")
    second, _ = track(cov, "b1")
    b2, b3 = watches(cmds)["b2"], watches(cmds)["b3"]
    assert cov.watched(b2, Answer.HAS_MESSAGE, now=1.0) == [Move(KEY, first)]
    assert cov.watched(b3, Answer.HAS_MESSAGE, now=1.0) == [Move(KEY, second)]
    assert (first.moved_to, second.moved_to) == ("b2", "b3")


def test_a_message_no_pop_can_move_to_is_passed_on_to_the_brokers_other_requests() -> None:
    cov = coverage()
    call = Call()
    held, cmds = track(cov, "b1", call=call)
    call.answered = True
    b2 = watches(cmds)["b2"]
    assert cov.watched(b2, Answer.HAS_MESSAGE, now=1.0) == [PassOn(b2)]
    assert held.moved_to is None


def test_a_watch_held_to_its_end_is_made_again_and_one_answered_at_once_only_after_a_pause() -> None:
    cov = coverage()
    _, cmds = track(cov, "b1", now=0.0)
    b2, b3 = watches(cmds)["b2"], watches(cmds)["b3"]
    again = cov.watched(b2, Answer.EMPTY, now=30.0)
    assert list(watches(again)) == ["b2"] and watches(again)["b2"] is not b2 and len(again) == 1
    assert cov.watched(b3, Answer.EMPTY, now=WATCH_MIN_S / 2) == [CoverLater(KEY, WATCH_RETRY_S)]  # not held


def test_a_failed_or_refused_watch_is_made_again_after_a_pause() -> None:
    for answer in (Answer.FAILED, Answer.FULL):
        cov = coverage()
        _, cmds = track(cov, "b1")
        assert cov.watched(watches(cmds)["b2"], answer, now=10.0) == [CoverLater(KEY, WATCH_RETRY_S)], answer
    cov = coverage()
    _, cmds = track(cov, "b1")
    assert cov.watched(watches(cmds)["b2"], Answer.NO_TOPIC, now=10.0) == []


def test_a_down_broker_is_watched_once_its_health_checks_see_it_up() -> None:
    health = {"b3": False}
    cov = coverage(health=health)
    _, cmds = track(cov, "b1")
    assert cmds[-1] == AwaitUp(KEY, "b3") and list(watches(cmds)) == ["b2"]
    assert cov.cover(KEY, now=1.0) == []  # already awaited: asked once
    health["b3"] = True
    up = cov.came_up(KEY, "b3", now=2.0)
    assert list(watches(up)) == ["b3"] and len(up) == 1


def test_a_down_broker_seen_up_without_its_await_answering_is_awaited_again_when_it_goes_down_again() -> None:
    """The broker moved while down: its new client is up, the old client's wait never answers. Watched again once
    `cover` sees it up, and its next restart is awaited again, not left unwatched for the group for good."""
    health = {"b3": False}
    cov = coverage(health=health)
    _, cmds = track(cov, "b1")
    assert cmds[-1] == AwaitUp(KEY, "b3")
    health["b3"] = True  # a new client at its new address: no came_up from the old one's wait
    b3 = watches(cov.cover(KEY, now=1.0))["b3"]
    health["b3"] = False  # restarted later: its watch fails
    assert cov.watched(b3, Answer.FAILED, now=2.0) == [CoverLater(KEY, WATCH_RETRY_S)]
    assert cov.cover(KEY, now=3.0) == [AwaitUp(KEY, "b3")]


def test_a_down_broker_is_no_longer_awaited_for_a_filter_whose_last_pop_ended() -> None:
    """Filters come and go while a broker is down: each one's wait ends with its last Pop, none piles up."""
    cov = coverage(health={"b3": False})
    for i in range(100):
        key = ("t", "g", f"tag{i}")
        entry, cmds = cov.track(key, "b1", Call(), now=0.0)
        assert AwaitUp(key, "b3") in cmds
        assert cov.untrack(key, "b1", entry) == [CoverLater(key, COVER_DELAY_S)]
        assert Unawait(key, "b3") in cov.cover(key, now=1.0)
        assert cov.came_up(key, "b3", now=2.0) == []  # a wait that answers anyway: the key is no longer held
    assert not cov._awaiting


def test_a_stale_watch_answer_changes_nothing() -> None:
    cov = coverage()
    held, cmds = track(cov, "b1")
    b2 = watches(cmds)["b2"]
    cov.untrack(KEY, "b1", held)
    assert cov.cover(KEY, now=1.0) == [Unwatch(b2), Unwatch(watches(cmds)["b3"])]
    assert cov.watched(b2, Answer.HAS_MESSAGE, now=1.0) == []


def test_a_groups_pops_cover_the_brokers_for_their_own_filter_only() -> None:
    """Consumers of one group with different filters (a subscription being changed): a broker holding only Pops
    with filter a is still watched for b, and a message for b there moves a Pop with filter b, never one with a."""
    cov = coverage()
    for_a, for_b = ("t", "g", "a"), ("t", "g", "b")
    pop_b, cmds_b = track(cov, "b3", key=for_b)
    pop_a, cmds_a = track(cov, "b1", key=for_a)
    assert [(w.broker, w.filter) for w in watches(cmds_b).values()] == [("b1", "b"), ("b2", "b")]
    assert [(w.broker, w.filter) for w in watches(cmds_a).values()] == [("b2", "a"), ("b3", "a")]
    assert len(cmds_a) == 2  # b's watch of b1 stays: a Pop with filter a does not take a message for b
    assert cov.watched(watches(cmds_b)["b1"], Answer.HAS_MESSAGE, now=1.0) == [Move(for_b, pop_b)]
    assert (pop_b.moved_to, pop_a.moved_to) == ("b1", None)


def test_a_changed_filter_is_watched_with_its_first_pop_and_the_old_filters_watches_end_with_its_last() -> None:
    """The group's subscription changes from a to b: the brokers are watched for b as soon as a Pop with b is
    held, and the watches for a end with the last Pop with a, not at the end of their 30 s hold."""
    cov = coverage()
    old, new = ("t", "g", "a"), ("t", "g", "b")
    last, before = track(cov, "b1", key=old)
    assert cov.untrack(old, "b1", last) == [CoverLater(old, COVER_DELAY_S)]
    _, after = track(cov, "b1", key=new)
    assert [(w.broker, w.filter) for w in watches(after).values()] == [("b2", "b"), ("b3", "b")]
    assert cov.cover(old, now=1.0) == [Unwatch(w) for w in watches(before).values()]
    assert [w.filter for w in watches(after).values() if cov.watching(w)] == ["b", "b"]


def test_a_broker_added_while_pops_are_held_is_watched_at_once() -> None:
    names = list(BROKERS)
    cov = Coverage(lambda: ((name, True) for name in names), cover=True)
    for name in BROKERS:  # one Pop held at each broker: nothing to watch
        cov.track(KEY, name, Call(), now=0.0)
    names.append("b4")  # broker discovery added it, and it is up
    assert list(watches(cov.broker_up("b4", now=1.0))) == ["b4"]
    assert cov.broker_up("b4", now=1.1) == []  # watched already
    assert Coverage(lambda: ((name, True) for name in names), cover=False).broker_up("b4", now=1.0) == []
