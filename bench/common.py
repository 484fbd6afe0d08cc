"""Shared helpers for the benchmarks: process resource readings and percentile tables."""

from __future__ import annotations

import os
import platform
import statistics
from datetime import UTC, datetime

from popgate.cli.benchmark import percentile

CLK_TCK = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


def machine() -> str:
    return f"{platform.node()} {os.cpu_count()} cores, Python {platform.python_version()}, {datetime.now(UTC):%Y-%m-%d}"


def table(rows: list[tuple[str, str, str]]) -> str:
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"| {a:<{width[0]}} | {b:>{width[1]}} | {c:<{width[2]}} |" for a, b, c in rows)
