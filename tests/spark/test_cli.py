"""The command line: durations and defaults (no Spark needed)."""

from __future__ import annotations

import argparse

import pytest

from spark_metrics.__main__ import build_parser, duration
from spark_metrics.report import render


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
