"""The job's output read back window by window: lag that does not dip when a broker is missing, stopped
consumers, per-broker skew and the polling evidence per group. Pure: rows in, series out, no Spark.

Rows are the output's (transform.OUTPUT_COLUMNS and transform.PROCESS_COLUMNS) as dicts, window bounds as
datetimes. Every series is a list indexed by window, from the first window to the last one, windows with no
row at all included (no process exported then: every broker seen before is missing in it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

Row = dict[str, Any]
Pair = tuple[str, str]  # (topic, group)


@dataclass(slots=True)
class PairSeries:
    """One topic/group pair. ``lag`` sums every broker's lag: its own in the windows it exported, its last one
    carried forward in the windows it is missing from (``carried``), so a missing broker makes no dip —
    tests/spark/test_health.py::test_a_missing_brokers_lag_is_carried_forward_and_the_windows_are_marked."""

    lag: list[float | None]
    lag_seconds: list[float | None]
    in_rate: list[float | None]
    out_rate: list[float | None]  # deliveries (pops, redeliveries included) per second
    acked_rate: list[float | None]  # the consumer offsets' advance per second: messages acked in order
    by_broker: dict[str, list[float | None]]
    carried: dict[str, list[bool]]
    delivered_by_broker: dict[str, float]  # deliveries over the span
    stopped: list[bool] = field(default_factory=list)

    def carried_at(self, i: int) -> bool:
        return any(flags[i] for flags in self.carried.values())


@dataclass(slots=True)
class GroupSeries:
    """One consumer group's proxy figures, summed over proxies, and the brokers' figures it needs beside them."""

    receives: list[float | None]
    hit_ratio: list[float | None]
    notify_share: list[float | None]
    empty_rate: list[float | None]
    empty: list[float | None]
    proxies: list[int]  # proxies with receives of the group
    broker_calls: list[float | None]  # receive-path broker calls (transform.processes_from)
    lost_races: list[float]  # notify consume Pops that found nothing: another notify receive of the group won
    delivered: list[float | None]  # deliveries over the group's topics
    ready: list[float | None]  # messages ready for the group at the window's end, over the brokers present
    false_empties: list[float]


@dataclass(slots=True)
class Timeline:
    window_s: float
    starts: list[datetime]
    brokers: list[str]  # every broker that exported in the span
    brokers_present: list[int]
    proxies_present: list[int]
    missing: list[tuple[str, ...]]  # per window: brokers that exported before and not in it
    # per window: some broker's counts are short in it (missing, or back from missing: its counters' increase
    # since the gap is not in any window)
    partial: list[bool]
    pairs: dict[Pair, PairSeries]
    groups: dict[str, GroupSeries]
    per_process: bool  # the output has per-process rows (written by this job's version or later)

    @property
    def ends(self) -> list[datetime]:
        step = timedelta(seconds=self.window_s)
        return [s + step for s in self.starts]


def build(windows: list[Row], processes: list[Row]) -> Timeline:
    """The timeline of the output's rows (both lists may come from several runs: duplicates are dropped before)."""
    every = [*windows, *processes]
    first = min(r["window_start"] for r in every)
    last = max(r["window_start"] for r in every)
    window_s = (every[0]["window_end"] - every[0]["window_start"]).total_seconds()
    count = round((last - first).total_seconds() / window_s) + 1
    starts = [first + timedelta(seconds=window_s * i) for i in range(count)]

    def at(row: Row) -> int:
        offset: float = (row["window_start"] - first).total_seconds()
        return int(round(offset / window_s))

    present: list[set[str]] = [set() for _ in starts]
    proxies = [0] * count
    for r in processes:
        if r["topic"] is None and r["group"] is None:
            if r["kind"] == "broker":
                present[at(r)].add(r["process"])
            else:
                proxies[at(r)] += 1
    first_seen: dict[str, int] = {}
    for i, names in enumerate(present):
        for name in names:
            first_seen.setdefault(name, i)
    missing = [tuple(sorted(b for b, j in first_seen.items() if j < i and b not in present[i])) for i in range(count)]
    timeline = Timeline(
        window_s=window_s,
        starts=starts,
        brokers=sorted(first_seen),
        brokers_present=[len(p) for p in present],
        proxies_present=proxies,
        missing=missing,
        partial=[bool(missing[i]) or (i > 0 and bool(missing[i - 1])) for i in range(count)],
        pairs={},
        groups={},
        per_process=bool(processes),
    )
    own = _by_window(windows, at, count)
    broker_rows = _broker_rows(processes, at, count)
    timeline.pairs = {pair: _pair(timeline, own.get(pair), broker_rows.get(pair, {})) for pair in _pairs(windows)}
    for series in timeline.pairs.values():
        series.stopped = _stopped(series, timeline.per_process)
    timeline.groups = _groups(timeline, own, broker_rows, processes, at)
    return timeline


def _pairs(windows: Iterable[Row]) -> list[Pair]:
    return sorted({(r["topic"], r["group"]) for r in windows if r["topic"]})


def _by_window(rows: Iterable[Row], at: Any, count: int) -> dict[Pair, list[Row | None]]:
    out: dict[Pair, list[Row | None]] = {}
    for r in rows:
        out.setdefault((r["topic"], r["group"]), [None] * count)[at(r)] = r
    return out


def _broker_rows(processes: Iterable[Row], at: Any, count: int) -> dict[Pair, dict[str, list[Row | None]]]:
    out: dict[Pair, dict[str, list[Row | None]]] = defaultdict(dict)
    for r in processes:
        if r["topic"] is not None and r["group"] is not None:
            out[(r["topic"], r["group"])].setdefault(r["process"], [None] * count)[at(r)] = r
    return out


def _pair(t: Timeline, own: list[Row | None] | None, brokers: dict[str, list[Row | None]]) -> PairSeries:
    count = len(t.starts)
    rows = own or [None] * count
    s = PairSeries(
        lag=[],
        lag_seconds=[],
        in_rate=[_get(r, "in_rate") for r in rows],
        out_rate=[_get(r, "out_rate") for r in rows],
        acked_rate=[None] * count,
        by_broker={},
        carried={},
        delivered_by_broker={b: sum(_get(r, "messages_out") or 0.0 for r in rs) for b, rs in brokers.items()},
    )
    ages: dict[str, list[float | None]] = {}
    for broker, series in brokers.items():
        lag, age, carried = _carry(t, broker, series)
        s.by_broker[broker], s.carried[broker], ages[broker] = lag, carried, age
    acked = _acked(t, brokers)
    for i, row in enumerate(rows):
        extra = [s.by_broker[b][i] for b in brokers if s.carried[b][i]]
        own_lag = _get(row, "consumer_lag")
        known = [v for v in (own_lag, *extra) if v is not None]
        s.lag.append(sum(known) if known else None)
        age_known = [v for v in (_get(row, "lag_seconds"), *(ages[b][i] for b in brokers if s.carried[b][i])) if v]
        s.lag_seconds.append(max(age_known) if age_known else _get(row, "lag_seconds"))
        count_acked = acked[i]
        s.acked_rate[i] = None if count_acked is None else count_acked / t.window_s
    return s


def _carry(
    t: Timeline, broker: str, rows: list[Row | None]
) -> tuple[list[float | None], list[float | None], list[bool]]:
    """A broker's lag and lag in time per window: its own where it exported, its last values where it is missing."""
    lag: list[float | None] = []
    age: list[float | None] = []
    carried: list[bool] = []
    last: Row | None = None
    for i, row in enumerate(rows):
        if row is not None:
            last = row
        is_carried = row is None and last is not None and broker in t.missing[i]
        source = row if row is not None else (last if is_carried else None)
        lag.append(_get(source, "consumer_lag"))
        age.append(_get(source, "lag_seconds"))
        carried.append(is_carried)
    return lag, age, carried


def _acked(t: Timeline, brokers: dict[str, list[Row | None]]) -> list[float | None]:
    """Messages acked in order per window: each broker's consumer-offset advance since its previous window with one
    (spread evenly over the windows between, so a broker back from a gap makes no spike); None where no broker
    with the pair has two such windows."""
    out: list[float | None] = [None] * len(t.starts)
    for rows in brokers.values():
        prev: tuple[int, float] | None = None
        for i, row in enumerate(rows):
            offset = _get(row, "consumer_offset")
            if offset is None:
                continue
            if prev is not None:
                share = max(0.0, offset - prev[1]) / (i - prev[0])  # an offset reset counts as no ack
                for j in range(prev[0] + 1, i + 1):
                    out[j] = (out[j] or 0.0) + share
            prev = (i, offset)
    return out


def _stopped(s: PairSeries, acks_known: bool) -> list[bool]:
    """Windows in which the pair's lag grew while nothing was delivered or acked (where acks are known) —
    tests/spark/test_health.py::test_consumers_that_stop_are_flagged_while_lag_grows_with_nothing_delivered_or_acked."""
    out = [False]
    for i in range(1, len(s.lag)):
        now, before = s.lag[i], s.lag[i - 1]
        grew = now is not None and before is not None and now > before
        idle = s.out_rate[i] is not None and s.out_rate[i] == 0
        if acks_known:
            idle = idle and not s.acked_rate[i]
        out.append(grew and idle)
    return out


def _groups(
    t: Timeline,
    own: dict[Pair, list[Row | None]],
    broker_rows: dict[Pair, dict[str, list[Row | None]]],
    processes: Iterable[Row],
    at: Any,
) -> dict[str, GroupSeries]:
    count = len(t.starts)
    names = sorted({g for (_, g) in own} | {g for (_, g) in broker_rows})
    out: dict[str, GroupSeries] = {}
    for name in names:
        rows = own.get(("", name), [None] * count)
        out[name] = GroupSeries(
            receives=[_get(r, "receives") for r in rows],
            hit_ratio=[_get(r, "polling_hit_ratio") for r in rows],
            notify_share=[_get(r, "notify_share") for r in rows],
            empty_rate=[_get(r, "empty_rate") for r in rows],
            empty=[_get(r, "empty_responses") for r in rows],
            proxies=[0] * count,
            broker_calls=[None] * count,
            lost_races=[0.0] * count,
            delivered=_sum_over(own, name, "messages_out", count),
            ready=[None] * count,
            false_empties=[0.0] * count,
        )
    for r in processes:
        g = out.get(r["group"]) if r["kind"] == "proxy" and r["topic"] is None else None
        if g is not None and r["receives"]:
            i = at(r)
            g.proxies[i] += 1
            g.broker_calls[i] = (g.broker_calls[i] or 0.0) + (r["broker_calls"] or 0.0)
            g.lost_races[i] += r["lost_races"] or 0.0
    for (_, name), brokers in broker_rows.items():
        ready = out[name].ready
        for rows in brokers.values():
            for i, row in enumerate(rows):
                value = _get(row, "ready")
                if value is not None:
                    ready[i] = (ready[i] or 0.0) + value
    for g in out.values():
        for i in range(1, count):
            # an empty answer while the group had messages ready at both ends of the window: a false empty
            if (g.ready[i - 1] or 0) > 0 and (g.ready[i] or 0) > 0:
                g.false_empties[i] = g.empty[i] or 0.0
    return out


def _sum_over(own: dict[Pair, list[Row | None]], group: str, column: str, count: int) -> list[float | None]:
    out: list[float | None] = [None] * count
    for (topic, g), rows in own.items():
        if g == group and topic:
            for i, row in enumerate(rows):
                value = _get(row, column)
                if value is not None:
                    out[i] = (out[i] or 0.0) + value
    return out


def _get(row: Row | None, column: str) -> Any:
    return None if row is None else row.get(column)


def episodes(flags: list[bool]) -> list[tuple[int, int]]:
    """Runs of consecutive flagged windows as (first, last) indexes."""
    out: list[tuple[int, int]] = []
    for i, flag in enumerate(flags):
        if flag and out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        elif flag:
            out.append((i, i))
    return out
