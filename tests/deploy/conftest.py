"""Fixtures for the deployment checks: rendered manifests and the external tools.

The tools come from `deploy/install-test-deps.sh` (kubectl is expected on PATH,
promtool from Debian's `prometheus` package, kubernetes-validate from PyPI). A
missing tool fails the test with the command that installs it: these checks are
never skipped silently.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
OVERLAYS = ("dev", "prod")
KUSTOMIZATIONS = {"base": K8S / "base", **{name: K8S / "overlays" / name for name in OVERLAYS}}
INSTALL_HINT = "run deploy/install-test-deps.sh (make test does)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "live_cluster: starts a real `popgate up` and a real Prometheus (needs the broker, proxy and `popgate up`)",
    )


def tool(name: str) -> str:
    """Path of an executable on PATH; fails the test (not skips) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` is not installed: {INSTALL_HINT}", pytrace=False)
    return path


def run(args: list[str], *, timeout: float = 60, stdin: str | None = None, cwd: Path | None = None) -> str:
    """Run a command; fail the test with its output unless it exits 0. Returns stdout + stderr."""
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {proc.returncode}:\n{output}", pytrace=False)
    return output


@pytest.fixture(scope="session")
def yaml_module() -> Any:
    try:
        import yaml  # PyYAML: a dependency of kubernetes-validate
    except ImportError:
        pytest.fail(f"PyYAML is not installed: {INSTALL_HINT}", pytrace=False)
    return yaml


@pytest.fixture(scope="session")
def rendered_text() -> dict[str, str]:
    """`kubectl kustomize` output for the base and every overlay, rendered once."""
    kubectl = tool("kubectl")
    return {name: run([kubectl, "kustomize", str(path)]) for name, path in KUSTOMIZATIONS.items()}


@pytest.fixture(scope="session")
def rendered(rendered_text: dict[str, str], yaml_module: Any) -> dict[str, list[dict[str, Any]]]:
    """The rendered objects per kustomization."""
    return {name: [d for d in yaml_module.safe_load_all(text) if d] for name, text in rendered_text.items()}
