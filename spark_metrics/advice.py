"""The adaptive switch's rate threshold recommended from history, per group and for the proxy fleet. Pure.

The proxy's adaptive mode (docs/RECEIVE.md) serves a group's receive by pop with notify while the group is quiet
and by coupled long polling once it is busy; `adaptive_rate_threshold` makes "busy" a receive rate per group on
one proxy. Each window of a group with receives is judged by what it cost and what it missed
(docs/SPARK.md, "The adaptive switch"):

- herd: served mostly by notify (notify share >= 50 %), notify receives of the group lost races to each other
  (several waited at once), and more broker calls per delivered message than one lone notify receive costs (a
  first Pop, a Notification per live broker, a consume Pop: brokers + 2); long polling would have served them
  at about one call per receive. The group should have long-polled at this rate.
- notify-ok: served mostly by notify without that: notify was right at this rate.
- false-empty: served mostly by long polling and answered empty while messages were ready at both ends of the
  window: notify would have found them. The group should have stayed in notify at this rate.

A group wants long polling from `at_most` = 0.8 × the 10th percentile of its herd windows' rates and notify up
to `at_least` = 1.25 × the 90th percentile of its notify-ok and false-empty windows' rates. The setting is per
proxy, not per group: the fleet's threshold is the geometric mean of the highest `at_least` and the lowest
`at_most`; 0 (off) when no group paid a herd, or when those two cross (no single rate serves every group).
tests/spark/test_advice.py checks each rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from spark_metrics.health import Timeline

NOTIFY_MAJORITY = 0.5
NOTIFY_MARGIN = 1.25  # keep notify this far above the rates where it was right
LONGPOLL_MARGIN = 0.8  # long-poll from this far below the rates where notify herded

HERD, NOTIFY_OK, FALSE_EMPTY = "herd", "notify-ok", "false-empty"


@dataclass(frozen=True, slots=True)
class Evidence:
    """One group in one window with receives."""

    rate: float  # receives per second per proxy that served the group
    calls_per_message: float | None  # receive-path broker calls per delivered message; None: nothing delivered
    notify_share: float
    false_empties: float
    brokers: int  # brokers that exported in the window
    lost_races: float = 0.0  # notify receives of the group that lost a race to another one

    @property
    def verdict(self) -> str | None:
        if self.notify_share >= NOTIFY_MAJORITY:
            if self.calls_per_message is None:
                return None
            costly = self.calls_per_message > self.brokers + 2
            # a lone receive also pays more per message when many of its receives end empty: only races are a herd
            return HERD if costly and self.lost_races > 0 else NOTIFY_OK
        return FALSE_EMPTY if self.false_empties > 0 else None


@dataclass(frozen=True, slots=True)
class GroupAdvice:
    group: str
    windows: int
    rate_low: float  # 10th and 90th percentile of the rate per proxy, receives/s
    rate_high: float
    calls_per_message: float | None  # over every window
    false_empties: float
    verdicts: dict[str, int]  # windows per verdict
    at_most: float | None
    at_least: float | None
    threshold: float  # what this group alone would want; 0 = the rate criterion off
    why: str


@dataclass(frozen=True, slots=True)
class Advice:
    rate_threshold: float
    proxies: int | None  # the fewest proxies that exported in a window: adaptive_proxies (docs/SCALE.md)
    groups: list[GroupAdvice]
    why: str


def evidence(t: Timeline, group: str) -> list[Evidence]:
    """The group's windows with receives, but those in which a broker's counts are short (Timeline.partial)."""
    g = t.groups[group]
    out = []
    for i, receives in enumerate(g.receives):
        if not receives or g.notify_share[i] is None or t.partial[i]:
            continue  # a window whose deliveries or ready messages are short would misjudge the group
        delivered, calls = g.delivered[i], g.broker_calls[i]
        per_message = calls / delivered if delivered and calls is not None else None
        out.append(
            Evidence(
                rate=receives / t.window_s / max(1, g.proxies[i]),
                calls_per_message=per_message,
                notify_share=g.notify_share[i] or 0.0,
                false_empties=g.false_empties[i],
                brokers=max(1, t.brokers_present[i]),
                lost_races=g.lost_races[i],
            )
        )
    return out


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def nice(value: float) -> float:
    """Two significant digits: a setting a person reads and types."""
    return float(f"{value:.2g}") if value > 0 else 0.0


def for_group(group: str, windows: list[Evidence]) -> GroupAdvice:
    by: dict[str, list[float]] = {HERD: [], NOTIFY_OK: [], FALSE_EMPTY: []}
    for w in windows:
        if w.verdict is not None:
            by[w.verdict].append(w.rate)
    at_most = nice(LONGPOLL_MARGIN * quantile(by[HERD], 0.1)) if by[HERD] else None
    notify_right = by[NOTIFY_OK] + by[FALSE_EMPTY]
    at_least = nice(NOTIFY_MARGIN * quantile(notify_right, 0.9)) if notify_right else None
    if at_most is not None and at_least is not None and at_least > at_most:
        threshold, why = 0.0, f"no rate parts its herd (>= {at_most}/s) from where notify was right (<= {at_least}/s)"
    elif at_most is not None:
        threshold = nice(math.sqrt(at_least * at_most)) if at_least else at_most
        why = f"notify herded at >= {at_most}/s: long-poll from {threshold}/s"
    elif at_least is not None:
        threshold, why = 0.0, f"notify was right up to {at_least}/s and never herded: any threshold above keeps it"
    else:
        threshold, why = (
            0.0,
            "no window said either way (long polling without a false empty, or notify that delivered nothing)",
        )
    rates = [w.rate for w in windows]
    known = [w for w in windows if w.calls_per_message is not None]
    return GroupAdvice(
        group=group,
        windows=len(windows),
        rate_low=quantile(rates, 0.1) if rates else 0.0,
        rate_high=quantile(rates, 0.9) if rates else 0.0,
        calls_per_message=sum(w.calls_per_message or 0.0 for w in known) / len(known) if known else None,
        false_empties=sum(w.false_empties for w in windows),
        verdicts={k: len(v) for k, v in by.items()},
        at_most=at_most,
        at_least=at_least,
        threshold=threshold,
        why=why,
    )


def for_fleet(groups: list[GroupAdvice], *, proxies: int | None) -> Advice:
    uppers = [(g.at_most, g.group) for g in groups if g.at_most is not None]
    lowers = [(g.at_least, g.group) for g in groups if g.at_least is not None]
    if not uppers:
        return Advice(0.0, proxies, groups, "no group paid the notify herd: the rate criterion stays off")
    hi, busy = min(uppers)
    if not lowers:
        return Advice(hi, proxies, groups, f"{busy} herded in notify from {hi}/s per proxy")
    lo, quiet = max(lowers)
    if lo > hi:
        why = f"{quiet} needs notify up to {lo}/s, {busy} long polling from {hi}/s: no one rate serves both, so off"
        return Advice(0.0, proxies, groups, why)
    threshold = min(hi, max(lo, nice(math.sqrt(lo * hi))))
    why = f"between {lo}/s ({quiet} kept in notify) and {hi}/s ({busy} long-polls)"
    return Advice(threshold, proxies, groups, why)


def recommend(t: Timeline) -> Advice:
    groups = [for_group(name, ev) for name in sorted(t.groups) if (ev := evidence(t, name))]
    seen = [n for n in t.proxies_present if n]
    return for_fleet(groups, proxies=min(seen) if seen else None)


def fragment(advice: Advice, *, first: datetime, last: datetime) -> str:
    """The proxy config fragment (TOML, the keys of the proxy's --config file), evidence as comments."""
    lines = [
        f"# Proxy settings recommended by spark_metrics from the windows {first:%Y-%m-%d %H:%M} to "
        f"{last:%Y-%m-%d %H:%M} UTC",
        '# (docs/SPARK.md, "The adaptive switch"). The adaptive switch is a setting of each proxy, for every group it',
        "# serves: give these keys to every proxy of the fleet, in its --config file, at the top level or in its",
        "# [proxy] table. Each group's evidence follows; its own wish is its last column.",
        f"# {advice.why}",
        f"adaptive_rate_threshold = {advice.rate_threshold}  # receives/s of one group on one proxy; 0 = off",
    ]
    if advice.proxies is not None:
        lines.append(f"adaptive_proxies = {advice.proxies}  # the fewest proxies that exported in a window")
    else:
        lines.append("# adaptive_proxies: no proxy exported in the span; keep yours")
    lines += [
        "# adaptive_concurrency_per_broker: not derived (the exports count no receives in progress per group);",
        "#   keep yours (default 1.0, docs/RECEIVE.md).",
        "#",
        f"# {'group':<20} {'windows':>7} {'rate/s p10-p90':>15} {'calls/msg':>9} {'false empty':>11} "
        f"{'herd/ok/f-e':>11}  this group alone",
    ]
    for g in advice.groups:
        calls = "-" if g.calls_per_message is None else f"{g.calls_per_message:.1f}"
        verdicts = f"{g.verdicts[HERD]}/{g.verdicts[NOTIFY_OK]}/{g.verdicts[FALSE_EMPTY]}"
        lines.append(
            f"# {g.group:<20} {g.windows:>7} {g.rate_low:>7.2f}-{g.rate_high:<7.2f} {calls:>9} "
            f"{g.false_empties:>11.0f} {verdicts:>11}  {g.threshold} ({g.why})"
        )
    return "\n".join(lines) + "\n"
