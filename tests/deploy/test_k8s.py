"""The Kubernetes manifests: they render, they validate strictly, and they keep their promises.

kubernetes-validate has schemas for the built-in kinds only: a CRD such as the
Prometheus Operator's ServiceMonitor gets a warning ("Couldn't find schema"),
which these tests count as a failure. So CRD objects are taken out before
kubernetes-validate runs, and the ServiceMonitor is checked here instead, against
a strict JSON schema of the fields it uses (servicemonitor.schema.json, written
from the operator's monitoring.coreos.com/v1 API) and against the Services it must
select.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import INSTALL_HINT, KUSTOMIZATIONS, OVERLAYS, PROMETHEUS
from .manifests import Obj, container, env_from_configmap, find, one, pod_spec, port, selects, workloads

ALL = tuple(KUSTOMIZATIONS)
CRD_GROUPS = ("monitoring.coreos.com/",)
SERVERS = {"broker": ("StatefulSet", "popgate-broker"), "proxy": ("Deployment", "popgate-proxy")}


def kubernetes_validate(path: Path) -> subprocess.CompletedProcess[str]:
    try:
        import kubernetes_validate  # noqa: F401
    except ImportError:
        pytest.fail(f"kubernetes-validate is not installed: {INSTALL_HINT}", pytrace=False)
    # A subprocess, as the CLI: the library's own imports warn under filterwarnings=error.
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("name", ALL)
def test_kustomize_renders_every_kind(rendered: dict[str, list[Obj]], name: str) -> None:
    kinds = {o["kind"] for o in rendered[name]}
    expected = {
        "StatefulSet",
        "Service",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "ConfigMap",
        "NetworkPolicy",
        "CronJob",
        "PersistentVolumeClaim",
    }
    assert expected <= kinds
    if name != "base":
        (namespace,) = find(rendered[name], "Namespace")
        namespaces = {o["metadata"].get("namespace") for o in rendered[name] if o["kind"] != "Namespace"}
        assert namespaces == {namespace["metadata"]["name"]}


@pytest.mark.parametrize("name", ALL)
def test_kubernetes_validate_strict_without_warnings(
    rendered: dict[str, list[Obj]], yaml_module: Any, tmp_path: Path, name: str
) -> None:
    builtin = [o for o in rendered[name] if not o["apiVersion"].startswith(CRD_GROUPS)]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml_module.safe_dump_all(builtin))
    proc = kubernetes_validate(path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    problems = [line for line in output.splitlines() if not line.startswith("INFO ")]
    assert problems == [], output
    assert output.count(" passed for resource ") == len(builtin), output


def test_kubernetes_validate_is_really_strict(rendered: dict[str, list[Obj]], yaml_module: Any, tmp_path: Path) -> None:
    statefulset = json.loads(json.dumps(one(rendered["base"], "StatefulSet", "popgate-broker")))
    container(statefulset)["readinessProbe"]["grpcc"] = {"port": 9001}  # a typo must not pass
    path = tmp_path / "typo.yaml"
    path.write_text(yaml_module.safe_dump(statefulset))
    proc = kubernetes_validate(path)
    assert proc.returncode != 0 and "grpcc" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ALL)
def test_servicemonitor_only_in_prod_and_selects_the_metrics_ports(rendered: dict[str, list[Obj]], name: str) -> None:
    monitors = find(rendered[name], "ServiceMonitor")
    if name != "prod":
        assert monitors == []
        return
    try:
        import jsonschema
    except ImportError:
        pytest.fail(f"jsonschema is not installed: {INSTALL_HINT}", pytrace=False)
    schema = json.loads((Path(__file__).parent / "servicemonitor.schema.json").read_text())
    (monitor,) = monitors
    jsonschema.Draft202012Validator(schema).validate(monitor)
    spec = monitor["spec"]
    services = [
        s
        for s in find(rendered[name], "Service")
        if s["metadata"]["namespace"] == monitor["metadata"]["namespace"]
        and selects(spec["selector"], s["metadata"]["labels"])
    ]
    assert {s["metadata"]["name"] for s in services} == {"popgate-broker", "popgate-proxy"}
    for endpoint in spec["endpoints"]:
        for service in services:
            assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}, service["metadata"]["name"]


@pytest.mark.parametrize("name", ALL)
def test_proxies_know_every_broker_by_its_pod_dns_name(rendered: dict[str, list[Obj]], name: str) -> None:
    objs = rendered[name]
    brokers = one(objs, "StatefulSet", "popgate-broker")
    service = one(objs, "Service", brokers["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    grpc = port(container(brokers), "grpc")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["grpc"] == grpc
    listed = env_from_configmap(objs, one(objs, "Deployment", "popgate-proxy"))["POPGATE_BROKER"].split(",")
    pods = [f"popgate-broker-{i}" for i in range(brokers["spec"]["replicas"])]
    # The key is the broker's --name (= pod name): receipt handles carry it.
    assert listed == [f"{pod}={pod}.{service['metadata']['name']}:{grpc}" for pod in pods]
    (name_env,) = [e for e in container(brokers)["env"] if e["name"] == "POPGATE_NAME"]
    assert name_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


@pytest.mark.parametrize("name", ALL)
def test_pods_run_unprivileged_with_limits(rendered: dict[str, list[Obj]], name: str) -> None:
    for workload in workloads(rendered[name]):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][bound]), (workload["metadata"]["name"], bound)
            # The read-only root leaves /tmp writable through an emptyDir.
            assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("server", sorted(SERVERS))
def test_servers_probe_grpc_health_drain_and_are_scraped(
    rendered: dict[str, list[Obj]], name: str, server: str
) -> None:
    workload = one(rendered[name], *SERVERS[server])
    spec = pod_spec(workload)
    c = container(workload)
    # Held long polls last at most 30 s and are answered on SIGTERM.
    assert spec["terminationGracePeriodSeconds"] >= 45
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == port(c, "grpc"), probe
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port(c, "metrics")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["POPGATE_METRICS_LISTEN"].endswith(f":{port(c, 'metrics')}")
    assert env["POPGATE_LISTEN"].endswith(f":{port(c, 'grpc')}")


@pytest.mark.parametrize("name", ALL)
def test_only_proxies_reach_the_brokers_grpc_port(rendered: dict[str, list[Obj]], name: str) -> None:
    objs = rendered[name]
    brokers = one(objs, "StatefulSet", "popgate-broker")
    broker_labels = brokers["spec"]["template"]["metadata"]["labels"]
    proxy_labels = one(objs, "Deployment", "popgate-proxy")["spec"]["template"]["metadata"]["labels"]
    grpc, metrics = port(container(brokers), "grpc"), port(container(brokers), "metrics")
    policies = [p for p in find(objs, "NetworkPolicy") if selects(p["spec"]["podSelector"], broker_labels)]
    assert policies and all("Ingress" in p["spec"]["policyTypes"] for p in policies)
    for policy in policies:
        for rule in policy["spec"]["ingress"]:
            ports = {p["port"] for p in rule.get("ports", [])}
            assert ports, "a rule without ports opens every port"
            assert rule.get("from"), "a rule without peers admits everyone"
            for peer in rule["from"]:
                assert "ipBlock" not in peer
                if grpc in ports:
                    assert "namespaceSelector" not in peer
                    assert selects(peer["podSelector"], proxy_labels)
                else:
                    assert ports == {metrics}
                    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "prometheus"


@pytest.mark.parametrize("name", ALL)
def test_proxies_autoscale_and_tolerate_disruption(rendered: dict[str, list[Obj]], name: str) -> None:
    objs = rendered[name]
    deployment = one(objs, "Deployment", "popgate-proxy")
    assert "replicas" not in deployment["spec"], "the HorizontalPodAutoscaler owns the replica count"
    (hpa,) = find(objs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "popgate-proxy"}
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert any(selects(p["spec"]["selector"], labels) for p in find(objs, "PodDisruptionBudget"))
    assert deployment["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] > 0


@pytest.mark.parametrize("name", ALL)
def test_brokers_keep_their_data_on_their_own_volume(rendered: dict[str, list[Obj]], name: str) -> None:
    brokers = one(rendered[name], "StatefulSet", "popgate-broker")
    (claim,) = brokers["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    env = {e["name"]: e.get("value") for e in container(brokers)["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container(brokers)["volumeMounts"]}
    assert env["POPGATE_DATA_DIR"] == mounts[claim["metadata"]["name"]]


@pytest.mark.parametrize("name", ALL)
def test_spark_cronjob_reads_what_the_servers_export(rendered: dict[str, list[Obj]], name: str) -> None:
    objs = rendered[name]
    (cronjob,) = find(objs, "CronJob")
    job = container(cronjob)
    assert job["command"][-2:] == ["-m", "spark_metrics"]
    args = job["args"]
    input_dir = args[args.index("--input") + 1]
    volumes = {v["name"]: v for v in pod_spec(cronjob)["volumes"]}
    (mount,) = [m for m in job["volumeMounts"] if input_dir.startswith(m["mountPath"] + "/")]
    claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
    one(objs, "PersistentVolumeClaim", claim)
    for kind, workload_name in SERVERS.values():
        server = one(objs, kind, workload_name)
        assert env_from_configmap(objs, server)["POPGATE_EXPORT_DIR"] == input_dir
        volume = {v["name"]: v for v in pod_spec(server)["volumes"]}[mount["name"]]
        assert volume["persistentVolumeClaim"]["claimName"] == claim


def test_overlays_differ_where_they_should(rendered: dict[str, list[Obj]]) -> None:
    replicas = {o: one(rendered[o], "StatefulSet", "popgate-broker")["spec"]["replicas"] for o in OVERLAYS}
    assert replicas == {"dev": 2, "prod": 3}
    flush = {
        o: env_from_configmap(rendered[o], one(rendered[o], "StatefulSet", "popgate-broker"))["POPGATE_FLUSH"]
        for o in OVERLAYS
    }
    assert flush == {"dev": "async", "prod": "sync"}


def test_servicemonitor_schema_rejects_a_typo(rendered: dict[str, list[Obj]]) -> None:
    import jsonschema

    schema = json.loads((Path(__file__).parent / "servicemonitor.schema.json").read_text())
    (monitor,) = find(rendered["prod"], "ServiceMonitor")
    broken = json.loads(json.dumps(monitor))
    broken["spec"]["endpoints"][0]["intreval"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="intreval"):
        jsonschema.Draft202012Validator(schema).validate(broken)


def container_env(objs: list[Obj], workload: Obj, field_refs: dict[str, str]) -> dict[str, str]:
    """The POPGATE_* environment a container starts with (fieldRefs resolved from `field_refs`)."""
    env = env_from_configmap(objs, workload)
    for item in container(workload).get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            env[item["name"]] = field_refs[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@pytest.mark.parametrize("name", ALL)
def test_the_real_settings_loaders_accept_the_manifests(rendered: dict[str, list[Obj]], name: str) -> None:
    from broker.settings import parse as broker_settings
    from proxy.settings import load as proxy_settings

    objs = rendered[name]
    brokers = one(objs, "StatefulSet", "popgate-broker")
    pods = [f"popgate-broker-{i}" for i in range(brokers["spec"]["replicas"])]
    for pod in pods:
        settings = broker_settings([], container_env(objs, brokers, {"metadata.name": pod}))
        assert settings.name == pod
    proxy = proxy_settings([], container_env(objs, one(objs, "Deployment", "popgate-proxy"), {}))
    assert [b.name for b in proxy.brokers] == pods


MIB = 1024 * 1024
_UNITS = {"Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB}


def memory_limit(workload: Obj) -> int:
    text = container(workload)["resources"]["limits"]["memory"]
    return int(text[:-2]) * _UNITS[text[-2:]]


@pytest.mark.parametrize("name", ALL)
def test_memory_limits_cover_what_the_servers_budgets_let_them_hold(rendered: dict[str, list[Obj]], name: str) -> None:
    """Twice the bytes a process lets in flight (a request is held about twice while handled: measured 1.7-2.4x)
    plus 128 MiB for the interpreter: the dev overlay's 512Mi under default budgets (448 MiB at a broker) was
    OOM-killed by sends it accepted (a review's probe)."""
    from broker.settings import parse as broker_settings
    from proxy.settings import load as proxy_settings

    objs = rendered[name]
    brokers = one(objs, "StatefulSet", "popgate-broker")
    b = broker_settings([], container_env(objs, brokers, {"metadata.name": "popgate-broker-0"}))
    broker_need = 2 * (b.max_send_bytes + b.max_pop_answer_bytes) + b.cache_bytes + 128 * MIB
    assert broker_need <= memory_limit(brokers), f"broker: {broker_need / MIB:.0f} MiB"
    proxy = one(objs, "Deployment", "popgate-proxy")
    p = proxy_settings([], container_env(objs, proxy, {}))
    proxy_need = 2 * (p.max_send_bytes + p.max_answer_bytes) + 128 * MIB
    assert proxy_need <= memory_limit(proxy), f"proxy: {proxy_need / MIB:.0f} MiB"


@pytest.mark.parametrize("name", ALL)
def test_prometheusrule_in_prod_carries_exactly_rules_yml(
    rendered: dict[str, list[Obj]], yaml_module: Any, name: str
) -> None:
    rules = find(rendered[name], "PrometheusRule")
    if name != "prod":
        assert rules == []
        return
    (rule,) = rules
    groups = yaml_module.safe_load((PROMETHEUS / "rules.yml").read_text())["groups"]
    assert rule["spec"]["groups"] == groups, "stale: run deploy/prometheus/prometheusrule.py"
    assert rule["metadata"]["namespace"] == one(rendered[name], "ServiceMonitor", "popgate")["metadata"]["namespace"]


@pytest.mark.parametrize("name", ALL)
def test_proxies_advertise_their_service(rendered: dict[str, list[Obj]], name: str) -> None:
    objs = rendered[name]
    service = one(objs, "Service", "popgate-proxy")
    advertise = env_from_configmap(objs, one(objs, "Deployment", "popgate-proxy"))["POPGATE_ADVERTISE"]
    host, _, port_number = advertise.rpartition(":")
    assert int(port_number) == {p["name"]: p["port"] for p in service["spec"]["ports"]}["grpc"]
    assert host.split(".")[0] == "popgate-proxy"
    if name != "base":
        assert host == f"popgate-proxy.{service['metadata']['namespace']}.svc"


@pytest.mark.parametrize("name", ALL)
def test_the_cronjob_prunes_snapshots_and_abandoned_tmp_files_past_the_retention(
    rendered: dict[str, list[Obj]], name: str, tmp_path: Path
) -> None:
    """A killed pod's `.tmp` file was never pruned: its name never comes back to publish it."""
    (cronjob,) = find(rendered[name], "CronJob")
    (prune,) = [c for c in pod_spec(cronjob)["initContainers"] if c["name"] == "prune-snapshots"]
    env = {e["name"]: e["value"] for e in prune["env"]}
    script = prune["command"][-1].replace("/var/lib/popgate/export", str(tmp_path))
    root = tmp_path / "snapshots" / "2026-11-20"
    root.mkdir(parents=True)
    old = time.time() - float(env["RETENTION_S"]) - 3600
    names = ("broker-b1-1.jsonl", ".proxy-gone-7.jsonl.tmp", "proxy-p-2.jsonl", ".proxy-live-3.jsonl.tmp")
    for i, file in enumerate(names):
        (root / file).write_text("{}\n")
        if i < 2:
            os.utime(root / file, (old, old))
    # A .tmp file a live exporter renames away between the listing and its stat (found at a minute boundary,
    # when the CronJob runs): listed, then not found. A dangling link is listed and not found the same way.
    (root / ".broker-live-4.jsonl.tmp").symlink_to(root / "published-meanwhile")
    names = (*names, ".broker-live-4.jsonl.tmp")
    out = subprocess.run([sys.executable, "-c", script], env={**env}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in root.iterdir()) == sorted(names[2:]), out.stdout
