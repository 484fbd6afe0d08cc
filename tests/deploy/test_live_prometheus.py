"""LIVE: a real Prometheus scrapes a real `popgate up --brokers 2 --no-view`.

Depends on the running system: the broker, the proxy and `popgate up` (popgate.cli.main).
Until `popgate up` exists this FAILS (it is not skipped): the dashboards and
alert rules in deploy/ are only as good as the metrics the processes really
export, and this is where that is checked.

What it does: starts `popgate up --prometheus-sd FILE` on a free 127.0.0.1 port,
reads its brokers and proxy and their metrics addresses from the file_sd targets it
writes, sends a little traffic, starts Debian's `prometheus` on a free port with
deploy/prometheus/rules.yml, a temporary data dir and that targets file (as
deploy/prometheus/prometheus-file-sd.yml reads it), and asks its HTTP API for the
broker and proxy series. Every /metrics is also linted
with `promtool check metrics`. Everything started is stopped in teardown; every
wait has a deadline.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from .conftest import PROMETHEUS, ROOT, run, tool
from .live_traffic import ProxyClient, Received
from .metrics_contract import BROKER, PROCESS, PROXY, exposition_types, missing_labels
from .test_prometheus import dashboard_exprs

pytestmark = [pytest.mark.live_cluster, pytest.mark.slow]

T = TypeVar("T")
TOPIC = "deploy-live"
GROUP = "deploy-live-group"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, *, log: Path | None = None) -> T:
    """Poll `probe` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}", pytrace=False)
        time.sleep(0.2)


def http_get(url: str, timeout: float = 2.0) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return None


def health_serving(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def stop_process_group(proc: subprocess.Popen[bytes], extra_pids: list[int]) -> None:
    """SIGTERM what we started, wait (held long polls drain within 30 s), then SIGKILL leftovers (`popgate up`'s
    children get SIGTERM from the kernel when it dies: PR_SET_PDEATHSIG)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in extra_pids:  # children that left our process group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(timeout=10)


@dataclass(frozen=True)
class Process:
    """A broker or proxy of `popgate up`, as its file_sd targets and its printed broker list tell."""

    kind: str  # "broker" | "proxy"
    name: str  # the `process` label
    metrics: str  # HOST:PORT of /metrics
    listen: str | None  # gRPC address (brokers)


@dataclass
class Cluster:
    proxy_endpoint: str
    brokers: list[Process]
    proxies: list[Process]
    targets: Path  # the file_sd file `popgate up` writes
    pid: int  # `popgate up` itself

    @property
    def processes(self) -> list[Process]:
        return self.brokers + self.proxies


def read_targets(path: Path, grpc_addresses: dict[str, str]) -> list[Process]:
    """The processes in a file_sd targets file (empty while it is not written yet)."""
    try:
        groups = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [
        Process(
            kind=group["labels"]["job"].removeprefix("popgate-"),
            name=group["labels"]["process"],
            metrics=group["targets"][0],
            listen=grpc_addresses.get(group["labels"]["process"]),
        )
        for group in groups
    ]


def printed_brokers(log: Path) -> dict[str, str]:
    """name -> gRPC address, from `popgate up`'s line "popgate: proxy endpoint E  (brokers b1=A, b2=B; logs ...)"."""
    for line in log.read_text().splitlines():
        if line.startswith("popgate: proxy endpoint") and "(brokers " in line:
            listed = line.split("(brokers ", 1)[1].split(";", 1)[0]
            return dict(entry.split("=", 1) for entry in listed.split(", "))
    return {}


def popgate_up_command() -> list[str]:
    try:
        import popgate.cli.main  # noqa: F401
    except ImportError as exc:
        pytest.fail(
            f"`popgate up` is not importable ({exc}). This live test needs the local cluster of the proxy issue "
            "(popgate.cli.main with `popgate up`); it fails instead of skipping so it cannot be forgotten.",
            pytrace=False,
        )
    script = Path(sys.executable).parent / "popgate"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from popgate.cli.main import main; sys.exit(main())"]


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


def send_traffic(cluster: Cluster) -> None:
    """A little traffic so that the labelled series exist: to each broker directly and through the proxy."""
    import grpc
    from popgate_pb import broker_pb2, broker_pb2_grpc

    for broker in cluster.brokers:
        assert broker.listen, f"no gRPC address found for {broker.name}"
        with grpc.insecure_channel(broker.listen) as channel:
            stub = broker_pb2_grpc.BrokerStub(channel)
            stub.Send(broker_pb2.SendRequest(messages=[broker_pb2.Message(topic=TOPIC, body=b"live")]), timeout=10)
            stub.Pop(
                broker_pb2.PopRequest(topic=TOPIC, group=GROUP, filter="*", max_messages=1, invisible_ms=60_000),
                timeout=10,
            )
    with ProxyClient(cluster.proxy_endpoint) as client:
        client.query_route(TOPIC)
        client.send(TOPIC, 1)


@dataclass
class Prometheus:
    url: str

    def query(self, promql: str) -> list[dict[str, Any]] | None:
        text = http_get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        if text is None:
            return None
        reply = json.loads(text)
        assert reply["status"] == "success", reply
        return list(reply["data"]["result"])


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


def test_prometheus_finds_broker_and_proxy_series(cluster: Cluster, prometheus: Prometheus) -> None:
    def all_up() -> list[dict[str, Any]] | None:
        result = prometheus.query('up{job=~"popgate-.*"} == 1')
        return result if result is not None and len(result) == len(cluster.processes) else None

    wait_for("every popgate target to be up", all_up, 20)

    def broker_series() -> set[str] | None:
        result = prometheus.query('count by (process) ({__name__=~"popgate_broker_.+", job="popgate-broker"})') or []
        processes = {r["metric"]["process"] for r in result}
        return processes if processes == {b.name for b in cluster.brokers} else None

    def proxy_series() -> list[dict[str, Any]] | None:
        return prometheus.query('{__name__=~"popgate_proxy_.+", job="popgate-proxy"}') or None

    wait_for("popgate_broker_* series from both brokers", broker_series, 15)
    wait_for("popgate_proxy_* series from the proxy", proxy_series, 15)
    stored = wait_for(
        "the messages sent to be counted",
        lambda: prometheus.query(f'sum(popgate_broker_messages_in_total{{topic="{TOPIC}"}})'),
        15,
    )
    assert float(stored[0]["value"][1]) >= len(cluster.brokers)


def evaluated_at(rule: dict[str, Any]) -> float:
    """A rule's lastEvaluation as epoch seconds (0 before its first evaluation)."""
    stamp = rule.get("lastEvaluation", "")
    if not stamp or stamp.startswith("0001-"):
        return 0.0
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    parsed = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return parsed.timestamp() + float(f"0.{fraction or 0}")


def test_prometheus_loads_and_evaluates_the_rules_without_error(cluster: Cluster, prometheus: Prometheus) -> None:
    def all_up() -> list[dict[str, Any]] | None:
        result = prometheus.query('up{job=~"popgate-.*"} == 1')
        return result if result is not None and len(result) == len(cluster.processes) else None

    wait_for("every popgate target to be scraped", all_up, 20)
    scraped = time.time()

    def evaluated() -> dict[str, Any] | None:  # every rule evaluated over scraped series, not an empty database
        text = http_get(f"{prometheus.url}/api/v1/rules")
        if text is None:
            return None
        groups = {g["name"]: g for g in json.loads(text)["data"]["groups"]}
        rules = [r for g in groups.values() for r in g["rules"]]
        return groups if rules and all(evaluated_at(r) > scraped for r in rules) else None

    groups = wait_for("every rule to be evaluated after the first scrapes", evaluated, 20)
    assert {"popgate.recording", "popgate.alerts"} <= set(groups)
    for group in groups.values():
        for rule in group["rules"]:
            assert rule.get("lastError", "") == "" and rule.get("health") == "ok", rule


def test_every_metrics_endpoint_passes_promtool_check_metrics(cluster: Cluster) -> None:
    promtool = tool("promtool")
    for process in cluster.processes:
        text = wait_for(f"/metrics of {process.name}", lambda p=process: http_get(f"http://{p.metrics}/metrics"), 10)
        output = run([promtool, "check", "metrics"], stdin=text)
        assert output.strip() == "", f"{process.name}: {output}"


def test_processes_export_what_rules_and_dashboard_read(cluster: Cluster) -> None:
    problems = []
    for process in cluster.processes:
        text = wait_for(f"/metrics of {process.name}", lambda p=process: http_get(f"http://{p.metrics}/metrics"), 10)
        exported = exposition_types(text)
        expected = (BROKER if process.kind == "broker" else PROXY) | PROCESS
        absent = {name: kind for name, kind in expected.items() if exported.get(name) != kind}
        if absent:
            problems.append(f"{process.name} does not export (as this type): {absent}")
        unlabelled = missing_labels(text, expected)
        if unlabelled:
            problems.append(f"{process.name} has samples without these labels: {unlabelled}")
    assert problems == [], "\n".join(problems)


ROUND = 8  # messages per round, one SendMessage each: spread over both brokers


def receive_at_least(client: ProxyClient, count: int) -> list[Received]:
    """Receive through the proxy until `count` messages came (more may: earlier ones left ready)."""
    got: list[Received] = []

    def enough() -> bool:
        got.extend(client.receive(TOPIC, GROUP, poll_s=0.5))
        return len(got) >= count

    wait_for(f"{count} messages received through the proxy", enough, 30)
    return got


def sample_value(prometheus: Prometheus, promql: str) -> float:
    result = prometheus.query(promql) or []
    return float(result[0]["value"][1]) if result else 0.0


@pytest.fixture(scope="module")
def consumed(cluster: Cluster, prometheus: Prometheus) -> None:
    """Two rounds of send, receive and ack through the proxy, the second once Prometheus has scraped the first, so
    that every counter the dashboard rates grew between two scrapes; then one dead letter of GROUP."""
    acked = 0
    total = f'sum(popgate_proxy_acks_total{{topic="{TOPIC}", group="{GROUP}", outcome="ok"}})'
    with ProxyClient(cluster.proxy_endpoint) as client:
        for round_number in (1, 2):
            for _ in range(ROUND):
                client.send(TOPIC, 1)
            got = receive_at_least(client, ROUND)
            client.ack(TOPIC, GROUP, got)
            acked += len(got)
            wait_for(
                f"round {round_number}'s {acked} acks to be scraped",
                lambda n=acked: sample_value(prometheus, total) >= n,
                20,
            )
        client.send(TOPIC, 1)
        client.dead_letter(TOPIC, GROUP, receive_at_least(client, 1)[0])


def finite_samples(result: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [r for r in result or [] if r["value"][1] not in ("NaN", "+Inf", "-Inf")]


@pytest.mark.parametrize("selected", ["one topic and group", "All"])
def test_every_dashboard_panel_returns_data(prometheus: Prometheus, consumed: None, selected: str) -> None:
    """Each query of each panel, as Grafana sends it with the test's topic and group chosen, or with "All",
    returns at least one finite value from the live cluster."""
    values = {"$topic": TOPIC, "$group": GROUP} if selected != "All" else {"$topic": ".*", "$group": ".*"}
    values["$__rate_interval"] = "2m"  # since the start of this Prometheus: both rounds of traffic are in it
    empty = []
    for title, expr in dashboard_exprs():
        promql = expr
        for variable, value in values.items():
            promql = promql.replace(variable, value)
        try:
            wait_for(f"{title}: {promql}", lambda q=promql: finite_samples(prometheus.query(q)), 10)
        except pytest.fail.Exception:
            empty.append(f"{title}: {promql}")
    assert empty == [], "queries without data:\n" + "\n".join(empty)


def broker_pid(cluster: Cluster, name: str) -> int:
    """The pid of `popgate up`'s broker child `name` (`python -m broker --name NAME ...`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == cluster.pid and b"broker" in argv and argv[argv.index(b"--name") + 1 :][:1] == [name.encode()]:
            return int(entry.name)
    pytest.fail(f"no broker {name} among the children of `popgate up` ({cluster.pid})", pytrace=False)


def broker_lag(broker: Process) -> float:
    """The broker's own lag of TOPIC/GROUP, from its /metrics."""
    text = wait_for(f"/metrics of {broker.name}", lambda: http_get(f"http://{broker.metrics}/metrics"), 10)
    prefix = f'popgate_broker_consumer_lag_messages{{group="{GROUP}",topic="{TOPIC}"}} '
    return sum(float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix))


def test_a_stopped_broker_keeps_its_lag_in_the_sums_and_is_seen_down(
    cluster: Cluster, prometheus: Prometheus, consumed: None
) -> None:
    """SIGSTOP one broker: Prometheus can no longer scrape it, yet the summed lag the lag alerts read does not dip
    (its last value is carried), the proxy reports it down and PopgateBrokerDown is pending. Runs last: the
    broker is continued at the end."""
    with ProxyClient(cluster.proxy_endpoint) as client:
        for _ in range(4):  # left unconsumed, on both brokers
            client.send(TOPIC, 1)
    stopped = cluster.brokers[-1].name
    lag = f'popgate:consumer_lag_messages:sum{{topic="{TOPIC}", group="{GROUP}"}}'
    live = f'sum(popgate_broker_consumer_lag_messages{{topic="{TOPIC}", group="{GROUP}"}})'
    truth = {b.name: broker_lag(b) for b in cluster.brokers}  # nothing consumes any more: it stays so
    assert truth[stopped] > 0, truth
    before = sum(truth.values())

    # Every broker's last scrape and the record caught up with them (what is carried is the last scrape).
    def caught_up() -> bool:
        for name, value in truth.items():
            own = f'popgate_broker_consumer_lag_messages{{topic="{TOPIC}", group="{GROUP}", process="{name}"}}'
            if sample_value(prometheus, own) != value:
                return False
        return sample_value(prometheus, lag) == before

    wait_for("Prometheus to have every broker's lag, and the record their sum", caught_up, 20)
    summed_since = time.time()
    pid = broker_pid(cluster, stopped)
    os.kill(pid, signal.SIGSTOP)
    try:
        carried = f'popgate:consumer_lag_brokers_carried:count{{topic="{TOPIC}", group="{GROUP}"}}'
        wait_for(f"{stopped}'s lag to be carried", lambda: sample_value(prometheus, carried) == 1, 20)
        assert sample_value(prometheus, live) < before  # what a plain sum would show now
        since = f"{max(1, int(time.time() - summed_since))}s"  # the evaluations since, the stop in the middle
        assert sample_value(prometheus, f"min_over_time({lag}[{since}])") == before  # never dipped
        down = f'popgate_proxy_broker_up{{broker="{stopped}"}} == 0'
        wait_for(f"the proxy to see {stopped} down", lambda: prometheus.query(down), 20)
        pending = f'ALERTS{{alertname="PopgateBrokerDown", broker="{stopped}"}}'
        wait_for("PopgateBrokerDown to be pending", lambda: prometheus.query(pending), 20)
    finally:
        os.kill(pid, signal.SIGCONT)
