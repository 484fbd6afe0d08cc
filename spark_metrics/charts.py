"""The report's charts, small multiples: one panel per topic/group (or group), each on its own scale, so a
large lagging group does not flatten the others. Grey bands: a broker missing from the export (its lag carried
forward, hatched); red bands: the group's consumers stopped."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from spark_metrics.advice import FALSE_EMPTY, HERD, NOTIFY_OK, Advice, evidence
from spark_metrics.health import Pair, PairSeries, Timeline, episodes

PANELS = 12  # per chart: the pairs (groups) with the highest peak
COLUMNS = 3
CHARTS = ("lag.png", "lag_seconds.png", "rates.png", "polling.png", "adaptive.png")


def write_all(t: Timeline | None, advice: Advice | None, directory: Path) -> list[Path]:
    """Every chart in ``directory``; with no data each says so (the files always exist)."""
    import matplotlib

    matplotlib.use("Agg")
    drawers: dict[str, Callable[[Timeline, Advice | None], Any]] = {
        "lag.png": _lag,
        "lag_seconds.png": _lag_seconds,
        "rates.png": _rates,
        "polling.png": _polling,
        "adaptive.png": _adaptive,
    }
    paths = []
    for name in CHARTS:
        fig = drawers[name](t, advice) if t is not None else _empty(name)
        path = directory / name
        fig.savefig(path, dpi=90)
        _close(fig)
        paths.append(path)
    return paths


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def _empty(name: str) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{name}: no complete window yet", ha="center", va="center")
    return fig


def _grid(count: int, title: str) -> tuple[Any, list[Any]]:
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    cols = min(COLUMNS, max(1, count))
    rows = max(1, math.ceil(count / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 2.6 * rows + 0.6), squeeze=False, sharex=True)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.axis("off")
    for ax in flat[:count]:
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M"))  # type: ignore[no-untyped-call]
        ax.tick_params(labelsize="small")
        ax.grid(alpha=0.3)
    fig.suptitle(title + " (UTC; grey: a broker missing from the export, red: consumers stopped)", fontsize="medium")
    if count == 0:
        flat[0].axis("off")
        flat[0].text(0.5, 0.5, "no topic/group in the span", ha="center", va="center")
    fig.tight_layout()
    return fig, flat[:count]


def _middles(t: Timeline) -> list[Any]:
    half = (t.ends[0] - t.starts[0]) / 2
    return [s + half for s in t.starts]


def _worst(t: Timeline, key: Callable[[PairSeries], float]) -> list[Pair]:
    return sorted(t.pairs, key=lambda p: (-key(t.pairs[p]), p))[:PANELS]


def _peak(values: Sequence[float | None]) -> float:
    return max((v for v in values if v is not None), default=0.0)


def _bands(ax: Any, t: Timeline, series: PairSeries | None) -> None:
    starts, ends = t.starts, t.ends
    for first, last in episodes([bool(m) for m in t.missing]):
        ax.axvspan(starts[first], ends[last], color="0.6", alpha=0.25, lw=0)
    if series is not None:
        for first, last in episodes(series.stopped):
            ax.axvspan(starts[first], ends[last], color="red", alpha=0.15, lw=0)


def _lag(t: Timeline, _: Advice | None) -> Any:
    pairs = _worst(t, lambda s: _peak(s.lag))
    fig, axes = _grid(len(pairs), "Consumer lag per topic/group, stacked by broker (hatched: carried forward)")
    width = t.window_s / 86400  # matplotlib dates are in days
    for ax, pair in zip(axes, pairs, strict=True):
        s = t.pairs[pair]
        base = [0.0] * len(t.starts)
        _bands(ax, t, s)
        for n, broker in enumerate(sorted(s.by_broker)):
            values = [v or 0.0 for v in s.by_broker[broker]]
            hatches = ["///" if c else "" for c in s.carried[broker]]
            color = f"C{n % 10}"
            bars = ax.bar(t.starts, values, width, bottom=base, align="edge", color=color, alpha=0.7, label=broker)
            for bar, hatch in zip(bars, hatches, strict=True):
                if hatch:
                    bar.set(hatch=hatch, alpha=0.35, edgecolor="black")
            base = [b + v for b, v in zip(base, values, strict=True)]
        ax.set_title(f"{pair[0]}/{pair[1]} (peak {_peak(s.lag):,.0f})", fontsize="small")
        if s.by_broker:
            ax.legend(fontsize="x-small", loc="upper left")
    return fig


def _lag_seconds(t: Timeline, _: Advice | None) -> Any:
    pairs = _worst(t, lambda s: _peak(s.lag_seconds))
    fig, axes = _grid(len(pairs), "Lag in time: age of the oldest unacked message (s)")
    for ax, pair in zip(axes, pairs, strict=True):
        s = t.pairs[pair]
        ax.plot(_middles(t), [v if v is not None else math.nan for v in s.lag_seconds], color="C3", marker=".")
        _bands(ax, t, s)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{pair[0]}/{pair[1]} (peak {_peak(s.lag_seconds):,.1f} s)", fontsize="small")
    return fig


def _rates(t: Timeline, _: Advice | None) -> Any:
    pairs = _worst(t, lambda s: max(_peak(s.in_rate), _peak(s.out_rate)))
    fig, axes = _grid(len(pairs), "Messages per second: stored, delivered (redeliveries too), acked in order")
    for ax, pair in zip(axes, pairs, strict=True):
        s = t.pairs[pair]
        for values, label, style in (
            (s.in_rate, "in", "C0"),
            (s.out_rate, "delivered", "C2"),
            (s.acked_rate, "acked", "C1"),
        ):
            ax.plot(
                _middles(t), [v if v is not None else math.nan for v in values], color=style, label=label, marker="."
            )
        _bands(ax, t, s)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{pair[0]}/{pair[1]}", fontsize="small")
        ax.legend(fontsize="x-small", loc="upper left")
    return fig


def _polling(t: Timeline, _: Advice | None) -> Any:
    groups = sorted(t.groups, key=lambda g: (-sum(v or 0.0 for v in t.groups[g].receives), g))
    groups = [g for g in groups if any(t.groups[g].receives)][:PANELS]
    fig, axes = _grid(len(groups), "Polling per group (%): first-Pop hit ratio, notify share, empty answers")
    for ax, name in zip(axes, groups, strict=True):
        g = t.groups[name]
        for values, label, color in (
            (g.hit_ratio, "hit", "C2"),
            (g.notify_share, "notify", "C4"),
            (g.empty_rate, "empty", "C7"),
        ):
            ax.plot(_middles(t), [100 * v if v is not None else math.nan for v in values], label=label, color=color)
        _bands(ax, t, None)
        ax.set_ylim(-5, 105)
        ax.set_title(f"{name} ({sum(v or 0.0 for v in g.receives):,.0f} receives)", fontsize="small")
        ax.legend(fontsize="x-small", loc="upper left")
    return fig


def _adaptive(t: Timeline, advice: Advice | None) -> Any:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    markers = {HERD: "^", NOTIFY_OK: "o", FALSE_EMPTY: "x", None: "."}
    drawn = 0
    for n, name in enumerate(sorted(t.groups)):
        points = [w for w in evidence(t, name) if w.rate > 0 and (w.calls_per_message or 0) > 0]
        for w in points:
            ax.scatter(w.rate, w.calls_per_message or 0.0, marker=markers[w.verdict], color=f"C{n % 10}", s=24)
        if points:
            ax.scatter([], [], color=f"C{n % 10}", label=name)
        drawn += len(points)
    if advice is not None and advice.rate_threshold > 0:
        ax.axvline(advice.rate_threshold, color="black", ls="--", label=f"threshold {advice.rate_threshold}/s")
    if drawn:  # log scales need a positive point; with none the chart says so
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.legend(fontsize="x-small")
    else:
        ax.text(0.5, 0.5, "no window with receives and deliveries", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("receives/s of the group per proxy (window average)")
    ax.set_ylabel("broker calls per delivered message")
    ax.set_title(
        "Adaptive switch evidence per window: ^ notify herd, o notify right, x false empties", fontsize="small"
    )
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return fig
