"""The report's reading of the output, on hand-made rows (no Spark): a missing broker's lag carried forward, a
window nobody exported, stopped consumers, acks from the consumer offsets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from spark_metrics.health import Timeline, build, episodes

START = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


def bounds(i: int) -> dict[str, Any]:
    return {"window_start": START + timedelta(minutes=i), "window_end": START + timedelta(minutes=i + 1)}


def pair_row(i: int, lag: float, out: float, **extra: Any) -> dict[str, Any]:
    return {**bounds(i), "topic": "t", "group": "g", "consumer_lag": lag, "messages_out": out, "out_rate": out / 60}


def broker_row(i: int, process: str, lag: float, offset: float, ready: float = 0.0) -> dict[str, Any]:
    common = {**bounds(i), "process": process, "kind": "broker"}
    return {**common, "topic": "t", "group": "g", "consumer_lag": lag, "consumer_offset": offset, "ready": ready}


def present(i: int, process: str, kind: str = "broker") -> dict[str, Any]:
    return {**bounds(i), "process": process, "kind": kind, "topic": None, "group": None}


def history(lags: dict[str, list[float | None]], offsets: dict[str, list[float]]) -> Timeline:
    """Brokers' lag and consumer offset per window (None: the broker did not export that window)."""
    windows, processes = [], []
    for i in range(len(next(iter(lags.values())))):
        here = [b for b in lags if lags[b][i] is not None]
        for b in here:
            processes += [present(i, b), broker_row(i, b, lags[b][i] or 0.0, offsets[b][i])]
        if here:
            out = sum(offsets[b][i] - offsets[b][i - 1] for b in here if i and lags[b][i - 1] is not None)
            windows.append(pair_row(i, sum(lags[b][i] or 0.0 for b in here), out))
    return build(windows, processes)


def test_a_missing_brokers_lag_is_carried_forward_and_the_windows_are_marked() -> None:
    t = history(
        {"b1": [10, 12, 14, 16, 18], "b2": [100, 100, None, None, 100]},
        {"b1": [0, 5, 10, 15, 20], "b2": [0, 0, 0, 0, 0]},
    )
    s = t.pairs[("t", "g")]
    assert t.missing == [(), (), ("b2",), ("b2",), ()]
    assert s.lag == [110, 112, 114, 116, 118]  # no dip: b2's last lag stands in for it
    assert [s.carried_at(i) for i in range(5)] == [False, False, True, True, False]
    assert t.partial == [False, False, True, True, True]  # and the window after: b2's counters restart there


def test_a_window_nobody_exported_is_in_the_timeline_with_every_broker_missing() -> None:
    t = history({"b1": [10, None, 30], "b2": [1, None, 3]}, {"b1": [0, 0, 0], "b2": [0, 0, 0]})
    assert len(t.starts) == 3 and t.missing[1] == ("b1", "b2")
    assert t.pairs[("t", "g")].lag == [11, 11, 33]


def test_acks_come_from_the_consumer_offsets_spread_over_a_gap() -> None:
    t = history({"b1": [0, 0, None, 0], "b2": [0, 0, 0, 0]}, {"b1": [0, 60, 0, 240], "b2": [0, 60, 120, 180]})
    # b1 acked 180 between windows 1 and 3 (not exported in window 2): 90 to each
    assert t.pairs[("t", "g")].acked_rate == [None, 2.0, 2.5, 2.5]


def test_consumers_that_stop_are_flagged_while_lag_grows_with_nothing_delivered_or_acked() -> None:
    t = history({"b1": [5, 5, 65, 125, 125, 125]}, {"b1": [0, 60, 60, 60, 60, 120]})
    s = t.pairs[("t", "g")]
    # windows 2 and 3: no ack, no delivery, lag grows; window 4: nothing arrived (lag flat): not a stop
    assert s.stopped == [False, False, True, True, False, False]
    assert episodes(s.stopped) == [(2, 3)]


def test_episodes() -> None:
    assert episodes([True, True, False, True, False, False, True]) == [(0, 1), (3, 3), (6, 6)]
    assert episodes([]) == []
