"""python -m spark_metrics --input DIR --output DIR [--window 60s] [--streaming] (also via spark-submit)."""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from spark_metrics.job import JobError, JobSettings, default_spark_log, run

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
    p.add_argument(
        "--report-span", type=duration, default=86400.0, help="the report covers this much before its last window"
    )
    p.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines, only the report")
    p.add_argument("-v", "--verbose", action="store_true", help="Spark's own log on stderr (default: in a file)")
    p.add_argument("--spark-log", type=Path, default=None, help="keep Spark's own log in this file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(
        level=level, format="%(asctime)s spark_metrics: %(message)s", datefmt="%H:%M:%S", stream=sys.stderr
    )
    # Only the job's own lines at INFO: py4j's, and matplotlib's first-run font cache note, are not progress —
    # tests/spark/test_cli.py::test_a_run_prints_progress_and_no_spark_log_lines.
    for library in ("py4j", "matplotlib"):
        logging.getLogger(library).setLevel(logging.WARNING)
    # Spark's own log goes to a file unless asked for; a temporary one is deleted after a run that succeeded
    spark_log = None if args.verbose else (args.spark_log or default_spark_log())
    settings = JobSettings(
        input=args.input,
        output=args.output,
        window_s=args.window,
        lateness_s=args.lateness,
        streaming=args.streaming,
        once=args.once,
        trigger_s=args.trigger,
        top=args.top,
        report_span_s=args.report_span,
    )
    try:
        run(settings, master=args.master, spark_log=spark_log)
    except JobError as exc:
        print(f"spark_metrics: {exc}", file=sys.stderr)
        _drop(spark_log, keep=args.spark_log)
        return 2
    except BaseException:
        if spark_log is not None:
            print(f"spark_metrics: failed; Spark's own log is in {spark_log}", file=sys.stderr)
        raise
    _drop(spark_log, keep=args.spark_log)
    return 0


def _drop(spark_log: Path | None, *, keep: Path | None) -> None:
    if spark_log is not None and spark_log != keep:
        spark_log.unlink(missing_ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
