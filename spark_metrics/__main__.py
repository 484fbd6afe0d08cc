"""python -m spark_metrics --input DIR --output DIR [--window 60s] [--streaming] (also via spark-submit)."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence

from spark_metrics.job import JobError, JobSettings, run

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """'60s', '2m', '500ms', '1h' or plain seconds -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 60s, 2m, 500ms")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spark_metrics", description="Aggregate popgate metric exports (docs/SPARK.md)")
    p.add_argument("--input", required=True, help="export directory (local path or Hadoop URI), read recursively")
    p.add_argument("--output", required=True, help="output directory: windows/ Parquet, report.txt, lag.png")
    p.add_argument("--window", type=duration, default=60.0, help="tumbling window (default 60s)")
    p.add_argument("--streaming", action="store_true", help="Structured Streaming: follow the directory")
    p.add_argument("--once", action="store_true", help="streaming: process the files there now, then stop")
    p.add_argument("--lateness", type=duration, default=180.0, help="streaming watermark delay (default 180s)")
    p.add_argument("--trigger", type=duration, default=10.0, help="streaming micro-batch interval (default 10s)")
    p.add_argument("--top", type=int, default=5, help="lagging groups listed in the report")
    p.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    settings = JobSettings(
        input=args.input,
        output=args.output,
        window_s=args.window,
        lateness_s=args.lateness,
        streaming=args.streaming,
        once=args.once,
        trigger_s=args.trigger,
        top=args.top,
    )
    try:
        run(settings, master=args.master)
    except JobError as exc:
        print(f"spark_metrics: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
