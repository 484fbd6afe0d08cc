"""`popgate up --prometheus-sd FILE`: the targets it writes are what deploy/prometheus/prometheus-file-sd.yml reads."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from popgate.cli.targets import Target, file_sd, write_file_sd

SAMPLE = Path(__file__).parents[3] / "deploy" / "prometheus" / "targets" / "example.json.sample"


def test_targets_have_the_job_and_process_labels_of_the_documented_sample() -> None:
    targets = [
        Target("proxy", "proxy-0", "127.0.0.1:9100"),
        Target("broker", "b1", "127.0.0.1:9101"),
        Target("broker", "b2", "127.0.0.1:9102"),
        Target("broker", "b3", ""),  # serves no /metrics: not a target
    ]
    assert file_sd(targets) == json.loads(SAMPLE.read_text())


def test_the_file_is_replaced_whole_readable_and_nothing_else_is_left(tmp_path: Path) -> None:
    path = tmp_path / "targets" / "popgate.json"  # its directory is made
    write_file_sd(path, [Target("broker", "b1", "127.0.0.1:1")])
    write_file_sd(path, [Target("broker", "b1", "127.0.0.1:2")])
    assert json.loads(path.read_text())[0]["targets"] == ["127.0.0.1:2"]
    assert [p.name for p in path.parent.iterdir()] == ["popgate.json"]  # no temporary file left beside it
    assert stat.S_IMODE(path.stat().st_mode) == 0o644  # a Prometheus running as another user reads it


def test_an_unwritable_path_is_an_os_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):
        write_file_sd(tmp_path / "file" / "popgate.json", [])
