"""The text report: flags first (brokers missing from the export, consumers stopped), then the most lagging
groups, per-broker skew, totals and the adaptive switch's recommendation."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from spark_metrics.advice import FALSE_EMPTY, HERD, NOTIFY_OK, Advice
from spark_metrics.health import Pair, Row, Timeline, episodes

ACKED_NOTE = (
    "  acked/s: the consumer offsets' advance (messages acked in order); no acked counter is exported yet"
    " (docs/METRICS.md §4), so a message acked out of order counts once those before it are"
)


def _fmt(value: Any, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}"


def _span(t: Timeline, first: int, last: int) -> str:
    clock = "%H:%M" if t.window_s % 60 == 0 else "%H:%M:%S"
    return f"{t.starts[first]:{clock}}-{t.ends[last]:{clock}}"


def render(windows: list[Row], t: Timeline | None, advice: Advice | None, *, top: int = 5) -> str:
    if not windows or t is None:
        return "popgate metrics: no complete window yet\n"
    lines = _header(windows, t) + [""] + flags(t) + [""] + _top(windows, t, top) + [""]
    lines += _skew(t, top) + [""] + _totals(windows, t, top)
    if advice is not None:
        lines += [""] + _advice(advice)
    return "\n".join(lines) + "\n"


def _header(windows: list[Row], t: Timeline) -> list[str]:
    pairs = {(r["topic"], r["group"]) for r in windows if r["topic"]}
    proxies = max(t.proxies_present, default=0)
    return [
        f"popgate metrics: {len(t.starts)} windows of {t.window_s:g} s from {t.starts[0]:%Y-%m-%d %H:%M:%S} to "
        f"{t.ends[-1]:%Y-%m-%d %H:%M:%S} UTC, {len(pairs)} topic/group pairs, {len({r['group'] for r in windows})} "
        f"groups; brokers {', '.join(t.brokers) or '-'}; proxies exporting: up to {proxies}"
    ]


def flags(t: Timeline) -> list[str]:
    """One line per broker missing from the export (its windows) and per stopped consumer group (its windows)."""
    out = []
    if not t.per_process:
        out.append("  ? no per-process rows in this output (written by an older job): missing brokers are not known")
    for broker in t.brokers:
        spans = episodes([broker in m for m in t.missing])
        if spans:
            count = sum(b - a + 1 for a, b in spans)
            still = " (still missing at the last window)" if spans[-1][1] == len(t.starts) - 1 else ""
            out.append(
                f"  ! broker {broker} missing from the export in {count} windows: "
                f"{', '.join(_span(t, a, b) for a, b in spans)}{still}; its last lag is carried forward there "
                "(* below, hatched in lag.png)"
            )
    for (topic, group), s in sorted(t.pairs.items()):
        for first, last in episodes(s.stopped):
            before, after = s.lag[first - 1], s.lag[last]
            receives = t.groups[group].receives[first : last + 1] if group in t.groups else []
            asked = sum(r or 0.0 for r in receives)
            who = "no receives: consumers gone" if not asked else f"{asked:.0f} receives, none delivered"
            still = " (still at the last window)" if last == len(t.starts) - 1 else ""
            out.append(
                f"  ! {topic}/{group}: consumers stopped {_span(t, first, last)} ({last - first + 1} windows): "
                f"nothing delivered or acked while lag grew {_fmt(before)} -> {_fmt(after)}; {who}{still}"
            )
    return ["Flags:", *(out or ["  none: every broker exported every window, no consumer stopped"])]


def _top(windows: list[Row], t: Timeline, top: int) -> list[str]:
    i = len(t.starts) - 1
    latest = [r for r in windows if r["window_start"] == t.starts[i]]
    # the polling ratios are the group's, on its topic "" row (METRICS.md §5); shown next to each of its topics
    polling = {r["group"]: r for r in latest if not r["topic"]}
    rows = {(r["topic"], r["group"]): r for r in latest if r["topic"]}
    ranked = sorted((p for p in t.pairs if t.pairs[p].lag[i] is not None), key=lambda p: (-(t.pairs[p].lag[i] or 0), p))
    lines = [
        f"Top lagging groups in the last window ({t.starts[i]:%H:%M:%S}; * a missing broker's lag carried forward):",
        "  (lag, inflight: RocketMQ's, from offsets (max - consumer, pull - consumer), so messages acked out of order"
        " count until the ones before them are; exact: ready + in flight, the brokers' gauges; docs/METRICS.md §5)",
        f"  {'topic':<20} {'group':<20} {'lag':>9} {'inflight':>8} {'exact':>8} {'avail':>8} {'lag s':>7} "
        f"{'hit %':>6} {'notify %':>8} {'empty %':>7} {'dlq+':>5} {'in/s':>7} {'out/s':>7} {'acked/s':>7}",
    ]
    for pair in ranked[:top]:
        s, r = t.pairs[pair], rows.get(pair, {})
        p = polling.get(pair[1], {})
        lag = _fmt(s.lag[i]) + ("*" if s.carried_at(i) else "")
        lines.append(
            f"  {pair[0]:<20} {pair[1]:<20} {lag:>9} {_fmt(r.get('inflight')):>8} {_fmt(r.get('exact_lag')):>8} "
            f"{_fmt(r.get('available')):>8} {_fmt(s.lag_seconds[i], '.1f'):>7} {_pct(p.get('polling_hit_ratio')):>6} "
            f"{_pct(p.get('notify_share')):>8} {_pct(p.get('empty_rate')):>7} {_fmt(r.get('dlq_growth')):>5} "
            f"{_fmt(s.in_rate[i], '.2f'):>7} {_fmt(s.out_rate[i], '.2f'):>7} {_fmt(s.acked_rate[i], '.2f'):>7}"
        )
    return lines


def _skew(t: Timeline, top: int) -> list[str]:
    i = len(t.starts) - 1
    ranked = sorted(t.pairs, key=lambda p: (-(t.pairs[p].lag[i] or 0), p))[:top]
    brokers = t.brokers
    lines = [
        "Per-broker skew: lag per broker in the last window (* carried forward), max/mean of it, and each broker's"
        " share of the deliveries over the span:",
        f"  {'topic/group':<32} " + " ".join(f"{b:>14}" for b in brokers) + f" {'max/mean':>8}",
    ]
    for pair in ranked:
        s = t.pairs[pair]
        delivered = sum(s.delivered_by_broker.values())
        cells, lags = [], []
        for b in brokers:
            lag = s.by_broker.get(b, [None] * len(t.starts))[i]
            share = s.delivered_by_broker.get(b, 0.0) / delivered if delivered else None
            mark = "*" if s.carried.get(b, [False] * len(t.starts))[i] else ""
            cells.append(f"{_fmt(lag) + mark} ({_pct(share)}%)")
            if lag is not None:
                lags.append(lag)
        mean = sum(lags) / len(lags) if lags else 0.0
        ratio = f"{max(lags) / mean:.2f}" if mean else "-"
        lines.append(f"  {pair[0] + '/' + pair[1]:<32} " + " ".join(f"{c:>14}" for c in cells) + f" {ratio:>8}")
    return lines


def _totals(windows: list[Row], t: Timeline, top: int) -> list[str]:
    peak: dict[Pair, float] = {p: max((v for v in s.lag if v is not None), default=0.0) for p, s in t.pairs.items()}
    totals: dict[str, float] = defaultdict(float)
    for r in windows:
        for name in ("receives", "first_pop_hits", "notify_runs", "empty_responses", "dlq_growth"):
            totals[name] += r[name] or 0.0  # each figure is on one row only: a plain sum is the total
    worst = sorted(peak.items(), key=lambda kv: -kv[1])[:top]
    receives = totals["receives"]

    def share(name: str) -> str:
        return _pct(totals[name] / receives if receives else None)

    return [
        "Over the whole span:",
        "  highest lag: " + ", ".join(f"{tp or '-'}/{g} {v:.0f}" for (tp, g), v in worst),
        f"  receives {receives:.0f}, polling hit ratio {share('first_pop_hits')} %, notify share "
        f"{share('notify_runs')} %, empty-response rate {share('empty_responses')} %, "
        f"dead-lettered {totals['dlq_growth']:.0f}",
        ACKED_NOTE,
    ]


def _advice(advice: Advice) -> list[str]:
    proxies = "-" if advice.proxies is None else str(advice.proxies)
    lines = [
        "Adaptive switch (a setting of each proxy, for every group; the fragment is adaptive.toml, docs/SPARK.md):",
        f"  adaptive_rate_threshold = {advice.rate_threshold}, adaptive_proxies = {proxies}: {advice.why}",
        f"  {'group':<20} {'windows':>7} {'rate/s/proxy':>15} {'calls/msg':>9} {'false empty':>11} "
        f"{'herd/ok/f-e':>11}  this group alone",
    ]
    for g in advice.groups:
        calls = "-" if g.calls_per_message is None else f"{g.calls_per_message:.1f}"
        verdicts = f"{g.verdicts[HERD]}/{g.verdicts[NOTIFY_OK]}/{g.verdicts[FALSE_EMPTY]}"
        rates = f"{g.rate_low:.2f}-{g.rate_high:.2f}"
        lines.append(
            f"  {g.group:<20} {g.windows:>7} {rates:>15} {calls:>9} {g.false_empties:>11.0f} {verdicts:>11}  "
            f"{g.threshold}: {g.why}"
        )
    return lines


def when(t: Timeline) -> tuple[datetime, datetime]:
    return t.starts[0], t.ends[-1]
