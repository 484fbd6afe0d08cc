"""The report of `bench.ratios`: one measured phase, the figures drawn from a run's phases against issue 28's
targets, and the tables and JSON line that print them."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import machine

ROOT = Path(__file__).resolve().parents[1]
# Issue 28's targets.
MIN_RATE_RATIO = 0.8
MAX_BROKER_CPU_RATIO = 1.2
MAX_SERVER_CPU_S_PER_100K = 8.0


@dataclass
class Phase:
    """One measured phase: its messages, wall time and the CPU seconds each process used meanwhile."""

    side: str  # "direct" or "sdk"
    kind: str  # "produce" or "consume"
    messages: int
    seconds: float
    cpu: dict[str, float]

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    def us_per_msg(self, *names: str) -> float:
        return sum(self.cpu[n] for n in names) / self.messages * 1e6


SIDES, KINDS = ("direct", "sdk"), ("produce", "consume")


def figures(rounds: list[list[Phase]], brokers: list[str]) -> dict[str, float]:
    """`side.metric`: the median of that side's two rounds; `metric_sdk_direct_ratio`: the median of the rounds'
    ratios, the nth sdk round against the nth direct round (bench.ratios.ROUNDS: round 2 against round 1, round 3
    against round 4, neighbours in time)."""
    groups = {"broker": tuple(brokers), "proxy": ("proxy",), "client": ("client",)}
    server = ("proxy", *brokers)  # in direct phases the proxy idles (health checks) and costs ~0
    series: dict[str, dict[str, list[float]]] = {}
    for side in SIDES:
        prod, cons = ([p for r in rounds for p in r if (p.side, p.kind) == (side, kind)] for kind in KINDS)
        both = list(zip(prod, cons, strict=True))

        def put(metric: str, values: list[float], side: str = side) -> None:
            series.setdefault(metric, {})[side] = values

        put("produce_msg_s", [p.rate for p in prod])
        put("consume_ack_msg_s", [c.rate for c in cons])
        for who, names in groups.items():
            put(f"{who}_produce_cpu_us_per_msg", [p.us_per_msg(*names) for p in prod])
            put(f"{who}_consume_ack_cpu_us_per_msg", [c.us_per_msg(*names) for c in cons])
        # Per message produced, consumed and acked: the two phases' costs added.
        put("broker_cpu_us_per_msg", [p.us_per_msg(*brokers) + c.us_per_msg(*brokers) for p, c in both])
        put("server_cpu_s_per_100k", [(p.us_per_msg(*server) + c.us_per_msg(*server)) / 10 for p, c in both])
        put("client_consume_ack_cpu_s_per_100k", [c.us_per_msg("client") / 10 for c in cons])
    values: dict[str, float] = {}
    for metric, by_side in series.items():
        for side, xs in by_side.items():
            values[f"{side}.{metric}"] = statistics.median(xs)
        if not metric.startswith("proxy") and all(by_side["direct"]):
            pairs = zip(by_side["sdk"], by_side["direct"], strict=True)
            values[f"{metric}_sdk_direct_ratio"] = statistics.median(s / d for s, d in pairs)
    return values


ROWS = [  # label, metric, target
    ("produce msg/s", "produce_msg_s", f">= {MIN_RATE_RATIO}x"),
    ("consume+ack msg/s", "consume_ack_msg_s", f">= {MIN_RATE_RATIO}x"),
    ("brokers' CPU µs/msg, produce", "broker_produce_cpu_us_per_msg", ""),
    ("brokers' CPU µs/msg, consume+ack", "broker_consume_ack_cpu_us_per_msg", ""),
    ("brokers' CPU µs/msg, produced+consumed+acked", "broker_cpu_us_per_msg", f"<= {MAX_BROKER_CPU_RATIO}x"),
    ("proxy CPU µs/msg, produce", "proxy_produce_cpu_us_per_msg", ""),
    ("proxy CPU µs/msg, consume+ack", "proxy_consume_ack_cpu_us_per_msg", ""),
    (
        "server (proxy + brokers) CPU s per 100k msgs",
        "server_cpu_s_per_100k",
        f"sdk <= {MAX_SERVER_CPU_S_PER_100K:g} s",
    ),
    ("client CPU µs/msg, produce", "client_produce_cpu_us_per_msg", ""),
    ("client CPU µs/msg, consume+ack", "client_consume_ack_cpu_us_per_msg", ""),
]


def number(value: float | None, suffix: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}{suffix}" if abs(value) >= 1000 else f"{value:.2f}{suffix}"


def ratio_table(values: dict[str, float], title: str) -> Table:
    table = Table(title=title)
    for column in ("figure", "direct", "sdk via proxy", "sdk / direct", "target"):
        table.add_column(column, justify="left" if column in ("figure", "target") else "right")
    for label, metric, target in ROWS:
        cells = [number(values.get(f"{side}.{metric}")) for side in SIDES]
        table.add_row(label, *cells, number(values.get(f"{metric}_sdk_direct_ratio"), "x"), target)
    return table


def process_table(rounds: list[list[Phase]], names: list[str]) -> Table:
    table = Table(title="CPU µs per message, by process and phase (each round)")
    for column in ("phase", "msg/s", *names):
        table.add_column(column, justify="left" if column == "phase" else "right")
    for i, phases in enumerate(rounds, 1):
        for p in phases:
            table.add_row(f"{i}. {p.side} {p.kind}", f"{p.rate:,.0f}", *(f"{p.us_per_msg(n):.1f}" for n in names))
    return table


def commit() -> tuple[str, bool]:
    """HEAD's short hash and whether tracked files differ from it (others' work in progress is measured too)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                capture_output=True, text=True)  # fmt: skip
    except OSError:
        return "", False
    return head.stdout.strip(), bool(status.stdout.strip())


def report(rounds: list[list[Phase]], brokers: list[str], args: argparse.Namespace, run_info: dict[str, Any]) -> None:
    values = figures(rounds, brokers)
    head, dirty = commit()
    record = {
        "benchmark": "ratios",
        **run_info,
        "commit": head,
        "dirty": dirty,
        "sdk": "popgate.aio",
        **{k: getattr(args, k) for k in ("brokers", "messages", "batch", "send_chunk", "size", "concurrency", "wait")},
        "direct_sends": "runs" if args.direct_runs else "messages",
        **{k: round(v, 3 if "ratio" in k else 2 if abs(v) < 100 else 0) for k, v in values.items()},
    }
    if not args.json:
        console = Console()
        if not console.is_terminal:
            console.width = 132
        console.print(f"ratios on {machine()}; commit {head}{' + uncommitted changes' if dirty else ''}")
        mode = run_info["receive_mode"]
        title = (f"{args.brokers} broker(s), receive mode {mode}, {args.messages:,} x {args.size} B per phase,"
                 f" batch {args.batch}{' (direct Sends as runs)' if args.direct_runs else ''},"
                 f" sdk send_many of {args.send_chunk}, concurrency {args.concurrency}; "
                 "medians of 2 rounds per side")  # fmt: skip
        console.print(ratio_table(values, title))
        console.print(process_table(rounds, ["client", "proxy", *brokers]))
        console.print(f"whole run {run_info['elapsed_s']:.0f} s")
    print(json.dumps(record), flush=True)
