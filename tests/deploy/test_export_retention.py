"""What the pods keep for the Spark CronJob, and what the CronJob still counts when a pod's files come late.

The relays' caps are checked with the real `prune` against the export rate docs/DEPLOY.md states ("Metrics
export"), at the largest broker and proxy the defaults allow.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import DEPLOY, KUSTOMIZATIONS, ROOT
from .manifests import Obj, find, flag, mount_of, one, pod_spec, sidecar, volumes

# Bytes a server exports per minute (six 10 s snapshots) for each topic/group pair (broker: each pair on a topic of
# its own, the most a pair costs) or group label (proxy), with 66-character group names; the largest server: a
# broker at its default --max-groups, a proxy at its label limit.
RATES = {
    "broker": (("StatefulSet", "popgate-broker"), 34_400, 10_000),
    "proxy": (("Deployment", "popgate-proxy"), 32_400, 1_000),
}
DEV_LARGEST = 100  # the dev overlay's small volumes hold this many pairs or groups
ROLL_S = 60  # one finished export file per roll period (docs/METRICS.md)
QUANTITY = re.compile(r"(\d+)(Ki|Mi|Gi)?")


def quantity(text: str) -> int:
    match = QUANTITY.fullmatch(text)
    assert match, text
    return int(match[1]) * {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}[match[2]]


def schedule_period_s(cronjob: Obj) -> int:
    minute, *rest = cronjob["spec"]["schedule"].split()
    assert minute.startswith("*/") and rest == ["*"] * 4, "a schedule every N minutes"
    return int(minute[2:]) * 60


def collect_gap_s(cronjob: Obj) -> int:
    """The longest time between two collects that reach a pod when it misses one: two periods, the second run
    starting as late as its startingDeadlineSeconds allows."""
    return 2 * schedule_period_s(cronjob) + int(cronjob["spec"]["startingDeadlineSeconds"])


@pytest.fixture(scope="module")
def relay() -> ModuleType:
    spec = importlib.util.spec_from_file_location("export_relay", DEPLOY / "image" / "export_relay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_docs_state_the_export_rates_these_checks_use() -> None:
    deploy = (ROOT / "docs" / "DEPLOY.md").read_text()
    for _, per_minute, _ in RATES.values():
        assert f"{per_minute / 1000:.1f} KB" in deploy


@pytest.mark.parametrize("name", tuple(KUSTOMIZATIONS))
@pytest.mark.parametrize("kind", tuple(RATES))
def test_a_relay_keeps_what_a_pod_exports_between_two_collects_at_the_largest_size(
    relay: ModuleType, rendered: dict[str, list[Obj]], name: str, kind: str, tmp_path: Path
) -> None:
    """A pod the CronJob skips once (recreating, slow) still has every file for the next collect, however many
    pairs the defaults let it export (dev: DEV_LARGEST); and its volume holds them beside what else it holds."""
    workload_id, per_minute, largest = RATES[kind]
    largest = DEV_LARGEST if name == "dev" else largest
    server = one(rendered[name], *workload_id)
    (cronjob,) = find(rendered[name], "CronJob")
    command = sidecar(server, "export-relay")["command"]
    keep_s, max_bytes = float(flag(command, "--keep-s")), int(flag(command, "--max-bytes"))
    file_bytes = per_minute * largest * ROLL_S // 60
    now = 1_796_000_000.0
    files = collect_gap_s(cronjob) // ROLL_S
    for n in range(files):
        now += ROLL_S
        path = tmp_path / f"{kind}-p-1796000000000-{n:04d}.jsonl"
        with path.open("wb") as out:
            out.truncate(file_bytes)  # sparse: prune reads sizes only
        os.utime(path, (now, now))
        assert relay.prune(tmp_path, keep_s=keep_s, max_bytes=max_bytes, now=now) == [], f"after {n + 1} minutes"
    volume, _ = mount_of(server, sidecar(server, "export-relay"), flag(command, "--dir"))
    if "claimTemplate" in volume:  # a broker: beside its store, which keeps most of the volume
        size = quantity(volume["claimTemplate"]["spec"]["resources"]["requests"]["storage"])
        assert max_bytes <= 0.4 * size
    else:  # a proxy: an emptyDir whose limit would evict the pod; the file in progress is on it too
        assert quantity(volume["emptyDir"]["sizeLimit"]) >= max_bytes + 2 * file_bytes
    assert set(volumes(server)) >= {volume["name"]}


@pytest.mark.parametrize("name", tuple(KUSTOMIZATIONS))
def test_the_cronjob_counts_files_a_pod_serves_one_collect_late(rendered: dict[str, list[Obj]], name: str) -> None:
    """Streaming drops a record more than --lateness behind the newest it read (less one window: a counter's
    baseline runs one window ahead). A pod skipped by one collect has its files copied by the next: the oldest is
    one collect gap and one roll period behind the newest then."""
    (cronjob,) = find(rendered[name], "CronJob")
    (job,) = pod_spec(cronjob)["containers"]
    args = job["args"]
    assert "--streaming" in args and "--once" in args

    def seconds(text: str) -> float:
        return float(text[:-1]) * {"s": 1, "m": 60}[text[-1]]

    lateness, window = seconds(flag(args, "--lateness")), seconds(flag(args, "--window"))
    gap = schedule_period_s(cronjob) + int(cronjob["spec"]["startingDeadlineSeconds"])
    assert lateness >= gap + ROLL_S + window
