"""The short text report and the PNG chart, from the job's Parquet output (small: windows x groups)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_metrics.paths import hadoop_fs, local_path

CHART_GROUPS = 10


def load(spark: SparkSession, path: str) -> list[dict[str, Any]]:
    """The output rows, one per window and topic/group (a streaming batch replayed after a crash is dropped)."""
    df = spark.read.parquet(path).dropDuplicates(["window_start", "topic", "group"])
    df = df.withColumns({c: F.unix_micros(c) for c in ("window_start", "window_end")})
    rows = [r.asDict() for r in df.orderBy("window_start", "topic", "group").collect()]
    for r in rows:  # timestamps in UTC whatever the driver's time zone
        for c in ("window_start", "window_end"):
            r[c] = datetime.fromtimestamp(r[c] / 1e6, UTC)
    return rows


def _fmt(value: Any, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def render(rows: list[dict[str, Any]], *, top: int = 5) -> str:
    if not rows:
        return "popgate metrics: no complete window yet\n"
    starts = sorted({r["window_start"] for r in rows})
    pairs = {(r["topic"], r["group"]) for r in rows if r["topic"]}
    last = starts[-1]
    lines = [
        f"popgate metrics: {len(starts)} windows from {starts[0]:%Y-%m-%d %H:%M:%S} to "
        f"{rows[-1]['window_end']:%Y-%m-%d %H:%M:%S} UTC, {len(pairs)} topic/group pairs, "
        f"{len({r['group'] for r in rows})} groups",
        "",
        f"Top lagging groups in the last window ({last:%H:%M:%S}):",
        "  (lag, inflight: RocketMQ's, from offsets (max - consumer, pull - consumer), so messages acked out of order"
        " count until the ones before them are; exact: ready + in flight, the brokers' gauges; docs/METRICS.md §5)",
        f"  {'topic':<20} {'group':<20} {'lag':>8} {'inflight':>8} {'exact':>8} {'avail':>8} {'lag s':>7} "
        f"{'hit %':>6} {'notify %':>8} {'empty %':>7} {'dlq+':>5}",
    ]
    latest = [r for r in rows if r["window_start"] == last]
    # the polling ratios are the group's, on its topic "" row (METRICS.md §5); shown next to each of its topics
    polling = {r["group"]: r for r in latest if not r["topic"]}
    lagging = sorted((r for r in latest if r["topic"]), key=lambda r: r["lag_rank"])
    for r in lagging[:top]:
        p = polling.get(r["group"], r)
        lines.append(
            f"  {r['topic']:<20} {r['group']:<20} {_fmt(r['consumer_lag']):>8} {_fmt(r['inflight']):>8} "
            f"{_fmt(r['exact_lag']):>8} {_fmt(r['available']):>8} {_fmt(r['lag_seconds'], '.1f'):>7} "
            f"{_pct(p['polling_hit_ratio']):>6} "
            f"{_pct(p['notify_share']):>8} {_pct(p['empty_rate']):>7} {_fmt(r['dlq_growth']):>5}"
        )
    lines += ["", "Over the whole span:"]
    peak: dict[tuple[str, str], float] = defaultdict(float)
    totals: dict[str, float] = defaultdict(float)
    for r in rows:
        if r["consumer_lag"] is not None:
            key = (r["topic"], r["group"])
            peak[key] = max(peak[key], r["consumer_lag"])
        for name in ("receives", "first_pop_hits", "notify_runs", "empty_responses", "dlq_growth"):
            totals[name] += r[name] or 0.0  # each figure is on one row only: a plain sum is the total
    worst = sorted(peak.items(), key=lambda kv: -kv[1])[:top]
    lines.append("  highest lag: " + ", ".join(f"{t or '-'}/{g} {v:.0f}" for (t, g), v in worst))
    receives = totals["receives"]

    def share(name: str) -> str:
        return _pct(totals[name] / receives if receives else None)

    lines.append(
        f"  receives {receives:.0f}, polling hit ratio {share('first_pop_hits')} %, notify share "
        f"{share('notify_runs')} %, empty-response rate {share('empty_responses')} %, "
        f"dead-lettered {totals['dlq_growth']:.0f}"
    )
    return "\n".join(lines) + "\n"


def _pct(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}"


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[tuple[datetime, float]]] = defaultdict(list)
    for r in rows:
        if r["consumer_lag"] is not None:
            series[(r["topic"], r["group"])].append((r["window_end"], r["consumer_lag"]))
    worst = sorted(series, key=lambda k: -max(v for _, v in series[k]))[:CHART_GROUPS]
    fig, ax = plt.subplots(figsize=(10, 5))
    for key in worst:
        points = sorted(series[key])
        times: Any = [p[0] for p in points]
        ax.plot(times, [p[1] for p in points], marker=".", label=f"{key[0]}/{key[1]}")
    ax.set_title("Consumer lag per group (messages, at window end)")
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("messages")
    if worst:
        ax.legend(loc="upper left", fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(spark: SparkSession, windows: str, *, output: str, top: int) -> str:
    """Render the report from the windows (Parquet) written so far; also save it and the chart in ``output``
    when that is local (a Hadoop URI gets the report on stdout only)."""
    rows = load(spark, windows) if _has_output(spark, windows) else []
    text = render(rows, top=top)
    local = local_path(output)
    if local is not None:
        local.mkdir(parents=True, exist_ok=True)
        tmp = local / ".report.txt.tmp"
        tmp.write_text(text)
        tmp.replace(local / "report.txt")
        chart(rows, local / "lag.png")
    return text


def _has_output(spark: SparkSession, path: str) -> bool:
    """Whether any Parquet file was written under `path` (a run whose input made no rows writes only
    `_SUCCESS`, and Spark cannot read a schema from that: the report would fail, and with it the streaming
    batch, replayed and failing again on every later run)."""
    fs, hpath = hadoop_fs(spark, path)
    if not fs.exists(hpath):
        return False
    files = fs.listFiles(hpath, True)
    while files.hasNext():
        if files.next().getPath().getName().endswith(".parquet"):
            return True
    return False
