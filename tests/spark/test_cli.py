"""The command line: durations, defaults, a missing input (Spark only where said)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from spark_metrics.__main__ import build_parser, duration, main
from spark_metrics.job import InputNotFound, read_records
from spark_metrics.paths import local_path
from spark_metrics.report import render
from tests.spark import scenario as S
from tests.spark.test_transform import write_jsonl


@pytest.mark.parametrize(("text", "seconds"), [("60s", 60), ("2m", 120), ("500ms", 0.5), ("1h", 3600), ("90", 90)])
def test_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0s", "-5s", "10 parsecs", "s"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


def test_defaults() -> None:
    args = build_parser().parse_args(["--input", "in", "--output", "out"])
    assert (args.window, args.streaming, args.lateness, args.master) == (60.0, False, 180.0, None)


def test_report_of_nothing_says_so() -> None:
    assert "no complete window" in render([])


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("out", Path("out")),
        ("/data/out", Path("/data/out")),
        ("file:/data/out", Path("/data/out")),
        ("file:///data/out", Path("/data/out")),
        ("file://localhost/data/out", Path("/data/out")),
        ("s3a://bucket/out", None),
        ("hdfs://nn:8020/out", None),
    ],
)
def test_one_reading_of_local_for_input_and_output(path: str, local: Path | None) -> None:
    """What the check before Spark reads of --input and where the report is saved of --output."""
    assert local_path(path) == local


@pytest.mark.parametrize("scheme", ["", "file://"])
def test_a_batch_run_over_a_missing_input_is_an_error_naming_it(
    scheme: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before Spark starts: a typo in --input is not an empty report with exit code 0."""
    missing = f"{scheme}{tmp_path}/exprot"
    assert main(["--input", missing, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spark_metrics: input {missing} does not exist") and err.count("\n") == 1
    assert not (tmp_path / "exprot").exists() and not (tmp_path / "out").exists()


def test_a_missing_input_on_another_file_system_is_checked_by_spark(spark: SparkSession, tmp_path: Path) -> None:
    """What the check before Spark cannot see (s3a://, hdfs://) Spark's file system does, as for this path."""
    with pytest.raises(InputNotFound):
        read_records(spark, str(tmp_path / "batch"))
    read_records(spark, str(tmp_path / "streaming"), streaming=True)  # made, to be watched
    assert (tmp_path / "streaming").is_dir() and not (tmp_path / "batch").exists()


@pytest.mark.timeout(330)  # its job's process has 300 s of its own
def test_a_run_prints_progress_and_no_spark_log_lines(tmp_path: Path) -> None:
    """In a process of its own, whose JVM the job starts: stderr holds only the job's progress lines (Spark's own
    log and the JVM's warnings go to a file, deleted after a run that succeeded), and the console progress bar,
    which the launcher of a JVM pyspark starts itself ("pyspark-shell") turns on, is off."""
    write_jsonl(tmp_path / "in" / "a.jsonl", S.all_rows())
    (tmp_path / "tmp").mkdir()
    argv = ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--master", "local[1]"]
    script = (
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "from spark_metrics.__main__ import main\n"
        f"code = main({argv!r})\n"
        "conf = SparkSession.getActiveSession().sparkContext.getConf()\n"
        "print('progress bar:', conf.get('spark.ui.showConsoleProgress'))\n"
        "sys.exit(code)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_GATEWAY_PORT", "PYSPARK_SUBMIT_ARGS")}
    env["TMPDIR"] = str(tmp_path / "tmp")  # where the Spark log file is made
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert lines and all(re.match(r"\d\d:\d\d:\d\d spark_metrics: \[", line) for line in lines), done.stderr[-3000:]
    assert any("windows written" in line for line in lines) and "done" in lines[-1]
    assert done.stdout.splitlines()[-1] == "progress bar: false"
    assert "popgate metrics: 3 windows" in done.stdout
    assert not list((tmp_path / "tmp").glob("spark_metrics-*.log"))
