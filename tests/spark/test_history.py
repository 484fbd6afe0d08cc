"""The report over an 11-minute history (tests/spark/history.py), one batch run: a broker missing from the export
for two windows and a group whose consumers stop are flagged, the lag does not dip, the adaptive threshold goes
below the herding group's rate and above the sparse one's, the fragment is a proxy config, the charts exist."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from proxy.settings import load as load_proxy_settings
from spark_metrics import charts, report
from spark_metrics.advice import Advice
from spark_metrics.health import Timeline
from spark_metrics.job import JobSettings, run_batch
from tests.spark import history
from tests.spark import scenario as S


@pytest.fixture(scope="module")
def out(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    export, output = tmp_path_factory.mktemp("history"), tmp_path_factory.mktemp("history-out")
    history.write(export)
    run_batch(spark, JobSettings(input=str(export), output=str(output)))
    return output


@pytest.fixture(scope="module")
def analysed(spark: SparkSession, out: Path) -> tuple[Timeline, Advice]:
    t, advice = report.analyse(*report.load(spark, str(out)))
    assert t is not None and advice is not None
    return t, advice


def flags(out: Path) -> list[str]:
    text = (out / "report.txt").read_text()
    return [line.strip() for line in text.split("Flags:\n")[1].split("\n\n")[0].splitlines()]


def test_a_broker_missing_from_the_export_is_named_with_its_windows(out: Path) -> None:
    [missing] = [line for line in flags(out) if "missing" in line]
    assert missing.startswith("! broker b3 missing from the export in 2 windows: 08:03-08:05;")


def test_the_summed_lag_does_not_dip_while_a_broker_is_missing(analysed: tuple[Timeline, Advice]) -> None:
    t, _ = analysed
    for pair in (("orders", "busy"), ("orders", "stops")):
        s = t.pairs[pair]
        assert s.lag[2] == s.lag[3] == s.lag[4] == s.lag[5]  # b3's share carried through windows 3 and 4
        assert [s.carried_at(i) for i in range(2, 6)] == [False, True, True, False]


def test_a_group_whose_consumers_stop_is_flagged(out: Path, analysed: tuple[Timeline, Advice]) -> None:
    [stopped] = [line for line in flags(out) if "consumers stopped" in line]
    assert stopped.startswith("! orders/stops: consumers stopped 08:07-08:11 (4 windows)")
    assert "no receives: consumers gone" in stopped and "still at the last window" in stopped
    t, _ = analysed
    assert not any(any(s.stopped) for pair, s in t.pairs.items() if pair != ("orders", "stops"))


def test_the_threshold_sends_the_busy_group_to_long_polling_and_keeps_the_sparse_one_in_notify(
    analysed: tuple[Timeline, Advice],
) -> None:
    _, advice = analysed
    groups = {g.group: g for g in advice.groups}
    busy, sparse = groups["busy"], groups["sparse"]
    assert busy.verdicts["herd"] > 0 and 0 < busy.threshold < busy.rate_low  # 40 receives/s, 12 calls/message
    assert sparse.verdicts["false-empty"] > 0 and sparse.at_least is not None and sparse.at_least > sparse.rate_high
    assert sparse.at_least < advice.rate_threshold < busy.rate_low
    assert advice.proxies == 1


@pytest.mark.parametrize("table", [False, True])
def test_the_fragment_is_a_config_the_proxy_takes(out: Path, tmp_path: Path, table: bool) -> None:
    fragment = (out / "adaptive.toml").read_text()
    config = tmp_path / "proxy.toml"
    config.write_text(("[proxy]\n" if table else "") + 'brokers = ["b1=127.0.0.1:1"]\n' + fragment)
    settings = load_proxy_settings(["--config", str(config)], {})
    expected = tomllib.loads(fragment)
    assert settings.adaptive_rate_threshold == expected["adaptive_rate_threshold"] > 0
    assert settings.adaptive_proxies == expected["adaptive_proxies"]


def test_the_charts_are_written(out: Path) -> None:
    for name in charts.CHARTS:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


def test_per_process_rows_say_which_broker_exported_each_window(spark: SparkSession, out: Path) -> None:
    rows: list[dict[str, Any]] = [r.asDict() for r in spark.read.parquet(str(out / "processes")).collect()]

    def window(r: dict[str, Any]) -> int:
        return int((r["window_start"].timestamp() - S.T0) // 60)

    present = {(window(r), r["process"]) for r in rows if r["topic"] is None and r["group"] is None}
    assert {w for w, p in present if p == "b3"} == set(range(11)) - {3, 4}
    assert {p for w, p in present if w == 3} == {"b1", "b2", "px"}
    busy = [r for r in rows if r["kind"] == "proxy" and r["group"] == "busy" and window(r) == 5]
    assert [(r["receives"], r["broker_calls"]) for r in busy] == [(2400, 14400)]  # 6 calls a notify run
    lag = {(window(r), r["process"]): r["consumer_lag"] for r in rows if r["group"] == "stops"}
    assert lag[(8, "b3")] == 20 + 2 * 400  # each broker's own lag: 20, then +400 a window from window 7
