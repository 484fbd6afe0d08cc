"""Prometheus file_sd targets for `popgate up --prometheus-sd FILE`.

deploy/prometheus/prometheus-file-sd.yml reads ``targets/*.json``: a list of target groups, each with its
``job`` label (``popgate-broker`` / ``popgate-proxy``, which overrides the scrape config's job name, so rules
and dashboards see the jobs the static config gives) and a ``process`` label (the broker's name, or the proxy's).
`popgate up` writes the file once its children are ready and again after each restart, each time whole:
written beside it, then renamed over it, so Prometheus never reads half of it
(tests/unit/sdk/test_targets.py).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Target:
    kind: str  # "broker" | "proxy"
    name: str  # b1, proxy
    metrics: str  # HOST:PORT of its /metrics ('' when it serves none)


def file_sd(targets: Iterable[Target]) -> list[dict[str, object]]:
    """One target group per process that serves /metrics, in the order given."""
    return [
        {"targets": [t.metrics], "labels": {"job": f"popgate-{t.kind}", "process": t.name}}
        for t in targets
        if t.metrics
    ]


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step (its directory made if need be); OSError when it cannot be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Prometheus watches targets/*.json: the temporary file's name must not match it.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would keep a Prometheus running as another user out
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_file_sd(path: Path, targets: Iterable[Target]) -> None:
    write_atomically(path, json.dumps(file_sd(targets), indent=2) + "\n")
