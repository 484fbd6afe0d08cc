"""Fixtures for the deployment checks: rendered manifests, the external tools and the live cluster.

The tools come from `deploy/install-test-deps.sh` (kubectl is expected on PATH,
promtool from Debian's `prometheus` package, kubernetes-validate from PyPI). A
missing tool fails the test with the command that installs it: these checks are
never skipped silently.

The LIVE tests (marker `live_cluster`) share two fixtures, started once per test module: `cluster` starts
`popgate up --brokers 2 --no-view --prometheus-sd FILE` on a free 127.0.0.1 port and reads its brokers and proxy
and their metrics addresses from the file_sd targets it writes (it FAILS, never skips, while `popgate up` is
missing: the dashboards and alert rules in deploy/ are only as good as the metrics the processes really export);
`prometheus` sends a little traffic and starts Debian's `prometheus` on a free port with
deploy/prometheus/rules.yml, a temporary data dir and that targets file (as deploy/prometheus/prometheus-file-sd.yml
reads it). Everything started is stopped in teardown; every wait has a deadline.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .live_cluster import (
    Cluster,
    Process,
    Prometheus,
    free_port,
    health_serving,
    http_get,
    popgate_up_command,
    printed_brokers,
    read_targets,
    send_traffic,
    stop_process_group,
    wait_for,
)

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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    command = popgate_up_command()
    work = tmp_path_factory.mktemp("popgate-up")
    port = free_port()
    log = work / "popgate-up.log"
    targets = work / "targets" / "popgate.json"
    args = ["up", "--brokers", "2", "--listen", f"127.0.0.1:{port}", "--data-dir", str(work / "data"), "--no-view"]
    # Every broker and the proxy serve /metrics on a free port; `popgate up` writes them as file_sd targets.
    args += ["--prometheus-sd", str(targets)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command + args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=ROOT,
            start_new_session=True,
        )
    found: list[Process] = []
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"`popgate up` exited with {proc.returncode}:\n{log.read_text()[-3000:]}", pytrace=False)
            return health_serving(f"127.0.0.1:{port}")

        wait_for("`popgate up` to serve gRPC health on its proxy port", ready, 45, log=log)

        def all_found() -> list[Process] | None:
            found[:] = read_targets(targets, printed_brokers(log))
            kinds = [p.kind for p in found]
            return found if kinds.count("broker") == 2 and kinds.count("proxy") >= 1 else None

        wait_for("2 brokers and a proxy in the targets `popgate up` writes", all_found, 10, log=log)
        yield Cluster(
            proxy_endpoint=f"127.0.0.1:{port}",
            brokers=[p for p in found if p.kind == "broker"],
            proxies=[p for p in found if p.kind == "proxy"],
            targets=targets,
            pid=proc.pid,
        )
    finally:
        stop_process_group(proc, [])


@pytest.fixture(scope="module")
def prometheus(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = tool("prometheus")
    import yaml

    work = tmp_path_factory.mktemp("prometheus")
    # The rules as shipped, but every group evaluated each second: a rule that fails only at evaluation
    # (the recording group runs every 30 s) shows its error within the test.
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    (work / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": [str(work / "rules.yml")],
        # As prometheus-file-sd.yml: one job whose target groups carry their own `job` label.
        "scrape_configs": [{"job_name": "popgate", "file_sd_configs": [{"files": [str(cluster.targets)]}]}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    run([tool("promtool"), "check", "config", str(work / "prometheus.yml")])
    port = free_port()
    log = work / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={work / 'prometheus.yml'}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for("Prometheus to be ready", lambda: proc.poll() is None and http_get(f"{url}/-/ready"), 20, log=log)
        send_traffic(cluster)
        yield Prometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
