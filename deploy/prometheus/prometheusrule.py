#!/usr/bin/env python3
"""Write rules.yml's groups as the prod overlay's PrometheusRule (Prometheus Operator).

    .venv/bin/python deploy/prometheus/prometheusrule.py          # rewrite it
    .venv/bin/python deploy/prometheus/prometheusrule.py --check  # exit 1 when stale

Needs PyYAML (deploy/install-test-deps.sh installs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules.yml"
TARGET = HERE.parent / "k8s" / "overlays" / "prod" / "prometheusrule.yaml"
HEADER = """\
# The alert and recording rules of deploy/prometheus/rules.yml for the
# Prometheus Operator. spec.groups must stay equal to that file's groups
# (tests/deploy checks it): regenerate with deploy/prometheus/prometheusrule.py.
"""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> Any:
    style = "|" if "\n" in data else None  # keep multi-line PromQL readable
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "popgate", "labels": {"app.kubernetes.io/name": "popgate"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the file is up to date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if TARGET.read_text() != text:
            print(f"{TARGET} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
