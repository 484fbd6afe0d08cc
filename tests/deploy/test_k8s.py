"""The Kubernetes manifests: they render, they validate strictly, and they keep their promises.

kubernetes-validate has schemas for the built-in kinds only: a CRD such as the
Prometheus Operator's ServiceMonitor gets a warning ("Couldn't find schema"),
which these tests count as a failure. So CRD objects are taken out before
kubernetes-validate runs, and the ServiceMonitor is checked here instead, against
a strict JSON schema of the fields it uses (servicemonitor.schema.json, written
from the operator's monitoring.coreos.com/v1 API) and against the Services it must
select; cert-manager's objects likewise (test_posture.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import INSTALL_HINT, KUSTOMIZATIONS, OVERLAYS, PROMETHEUS
from .manifests import (
    Obj,
    all_containers,
    container,
    env_from_configmap,
    find,
    flag,
    mount_of,
    one,
    pod_spec,
    port,
    selects,
    sidecar,
    workloads,
)
from .server_env import server_env

ALL = tuple(KUSTOMIZATIONS)
CRD_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")
CLUSTER_SCOPED = ("Namespace", "PriorityClass")
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
        namespaces = {o["metadata"].get("namespace") for o in rendered[name] if o["kind"] not in CLUSTER_SCOPED}
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
def test_proxies_find_every_broker_in_dns_by_its_pod_name(rendered: dict[str, list[Obj]], name: str) -> None:
    """No hand-kept broker list: the proxies follow the SRV record of the headless Service's grpc port, whose
    targets are the pods' names (tests/integration/proxy/test_discovery.py shows the proxy following it)."""
    objs = rendered[name]
    brokers = one(objs, "StatefulSet", "popgate-broker")
    service = one(objs, "Service", brokers["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    grpc = port(container(brokers), "grpc")
    (grpc_port,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc_port["port"] == grpc and grpc_port.get("protocol", "TCP") == "TCP"
    env = env_from_configmap(objs, one(objs, "Deployment", "popgate-proxy"))
    assert "POPGATE_BROKER" not in env
    assert env["POPGATE_BROKER_SRV"] == f"_grpc._tcp.{service['metadata']['name']}"
    # The key is the broker's --name (= pod name, the SRV target's first label): receipt handles carry it.
    (name_env,) = [e for e in container(brokers)["env"] if e["name"] == "POPGATE_NAME"]
    assert name_env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


@pytest.mark.parametrize("name", ALL)
def test_pods_run_unprivileged_with_limits(rendered: dict[str, list[Obj]], name: str) -> None:
    for workload in workloads(rendered[name]):
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert spec["automountServiceAccountToken"] is False
        for c in all_containers(workload):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][bound]), (workload["metadata"]["name"], c["name"], bound)
        for c in spec["containers"]:
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
    if "grpc" in c["readinessProbe"]:
        assert c["readinessProbe"]["grpc"]["port"] == port(c, "grpc")
    else:  # TLS: kubelet's grpc probe cannot speak it (test_posture.py checks the TLS options)
        command = c["readinessProbe"]["exec"]["command"]
        assert command[0] == "popgate-grpc-health" and command[-1] == f"127.0.0.1:{port(c, 'grpc')}"
    annotations = workload["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port(c, "metrics")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["POPGATE_METRICS_LISTEN"].endswith(f":{port(c, 'metrics')}")
    assert env["POPGATE_LISTEN"].endswith(f":{port(c, 'grpc')}")


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("server", sorted(SERVERS))
def test_liveness_asks_whether_the_process_runs_not_whether_it_is_ready(
    rendered: dict[str, list[Obj]], name: str, server: str
) -> None:
    """A broker whose files were deleted, or a proxy whose first discovery lookup has not answered, is not ready
    (gRPC health NOT_SERVING) on purpose, and a restart fixes neither (a broker's would serve an empty store under
    its name): liveness is the metrics server's /livez, which answers while the process's event loop runs."""
    c = container(one(rendered[name], *SERVERS[server]))
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": port(c, "metrics")}
    assert c["livenessProbe"] != c["readinessProbe"]


@pytest.mark.parametrize("name", ALL)
def test_a_broker_migrating_or_reading_its_store_is_started_not_killed(
    rendered: dict[str, list[Obj]], name: str
) -> None:
    """A broker serves gRPC only once its store is migrated and read (minutes on a large one; test_start.py: /livez
    answers meanwhile): its startupProbe asks /livez, so it is not killed mid-migration, which would roll the
    migration back and crash-loop the pod; readiness alone waits for the store."""
    c = container(one(rendered[name], *SERVERS["broker"]))
    assert c["startupProbe"]["httpGet"] == {"path": "/livez", "port": port(c, "metrics")}
    assert "grpc" in c["readinessProbe"] or "exec" in c["readinessProbe"]


@pytest.mark.parametrize("name", ALL)
def test_only_proxies_reach_the_brokers_grpc_port(rendered: dict[str, list[Obj]], name: str) -> None:
    objs = rendered[name]
    brokers = one(objs, "StatefulSet", "popgate-broker")
    broker_labels = brokers["spec"]["template"]["metadata"]["labels"]
    proxy_labels = one(objs, "Deployment", "popgate-proxy")["spec"]["template"]["metadata"]["labels"]
    grpc, metrics = port(container(brokers), "grpc"), port(container(brokers), "metrics")
    export = {p["name"]: p["containerPort"] for p in sidecar(brokers, "export-relay")["ports"]}["export"]
    (cronjob,) = find(objs, "CronJob")
    collector_labels = cronjob["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
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
                elif export in ports:  # finished metric exports: the Spark CronJob's collector only
                    assert ports == {export} and "namespaceSelector" not in peer
                    assert selects(peer["podSelector"], collector_labels)
                    assert not selects(peer["podSelector"], proxy_labels)
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
def test_spark_cronjob_collects_what_every_server_pod_exports(rendered: dict[str, list[Obj]], name: str) -> None:
    """No shared volume between the data plane and the job: each server pod's export-relay sidecar serves the
    directory its server exports to; the CronJob's collector reaches every such pod through one headless Service
    and copies into the directory the job reads."""
    objs = rendered[name]
    (cronjob,) = find(objs, "CronJob")
    job = container(cronjob)
    assert job["command"][-2:] == ["-m", "spark_metrics"]
    input_dir = flag(job["args"], "--input")
    (collect,) = [c for c in pod_spec(cronjob)["initContainers"] if c["name"] == "collect-exports"]
    assert collect["command"][:2] == ["popgate-export-relay", "collect"]
    assert flag(collect["command"], "--into") == input_dir
    into_volume, _ = mount_of(cronjob, collect, input_dir)
    job_volume, _ = mount_of(cronjob, job, input_dir)
    assert into_volume == job_volume and "persistentVolumeClaim" in job_volume
    one(objs, "PersistentVolumeClaim", job_volume["persistentVolumeClaim"]["claimName"])
    service = one(objs, "Service", flag(collect["command"], "--service"))
    assert service["spec"]["clusterIP"] == "None", "one address per pod"
    assert service["spec"]["publishNotReadyAddresses"] is True
    relay_port = int(flag(collect["command"], "--port"))
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [relay_port]
    for kind, workload_name in SERVERS.values():
        server = one(objs, kind, workload_name)
        assert selects({"matchLabels": service["spec"]["selector"]}, server["spec"]["template"]["metadata"]["labels"])
        relay = sidecar(server, "export-relay")
        assert relay["command"][:2] == ["popgate-export-relay", "serve"]
        assert flag(relay["command"], "--listen").endswith(f":{relay_port}")
        assert {p["name"]: p["containerPort"] for p in relay["ports"]}["export"] == relay_port
        export_dir = env_from_configmap(objs, server)["POPGATE_EXPORT_DIR"]
        assert flag(relay["command"], "--dir") == export_dir
        # The same volume under the same path in the server and its relay.
        served, served_mount = mount_of(server, relay, export_dir)
        written, written_mount = mount_of(server, container(server), export_dir)
        assert served == written and served_mount["mountPath"] == written_mount["mountPath"]
        # A file the CronJob pruned must not be collected again: the pods forget theirs first.
        (prune,) = [c for c in pod_spec(cronjob)["initContainers"] if c["name"] == "prune-snapshots"]
        retention = float({e["name"]: e["value"] for e in prune["env"]}["RETENTION_S"])
        assert float(flag(relay["command"], "--keep-s")) < retention
    names = [c["name"] for c in pod_spec(cronjob)["initContainers"]]
    assert names.index("prune-snapshots") < names.index("collect-exports")


def test_overlays_differ_where_they_should(rendered: dict[str, list[Obj]]) -> None:
    replicas = {o: one(rendered[o], "StatefulSet", "popgate-broker")["spec"]["replicas"] for o in OVERLAYS}
    assert replicas == {"dev": 2, "prod": 3}
    flush = {
        o: env_from_configmap(rendered[o], one(rendered[o], "StatefulSet", "popgate-broker"))["POPGATE_FLUSH"]
        for o in OVERLAYS
    }
    assert flush == {"dev": "async", "prod": "sync"}


def test_grpc_ports_name_their_transport_as_the_servers_serve_it(rendered: dict[str, list[Obj]]) -> None:
    """A mesh or a Gateway reading a port's appProtocol speaks what it says: cleartext HTTP/2 (h2c) where the servers
    serve no TLS (dev), nothing where they serve TLS (prod: Kubernetes has no standard name for HTTP/2 over TLS)."""
    for overlay in OVERLAYS:
        tls = "POPGATE_TLS_CERT" in env_from_configmap(rendered[overlay], one(rendered[overlay], *SERVERS["proxy"]))
        for service in ("popgate-proxy", "popgate-broker"):
            [grpc] = [p for p in one(rendered[overlay], "Service", service)["spec"]["ports"] if p["name"] == "grpc"]
            assert grpc.get("appProtocol") == (None if tls else "kubernetes.io/h2c"), (overlay, service)
        assert tls == (overlay == "prod")


def test_servicemonitor_schema_rejects_a_typo(rendered: dict[str, list[Obj]]) -> None:
    import jsonschema

    schema = json.loads((Path(__file__).parent / "servicemonitor.schema.json").read_text())
    (monitor,) = find(rendered["prod"], "ServiceMonitor")
    broken = json.loads(json.dumps(monitor))
    broken["spec"]["endpoints"][0]["intreval"] = "15s"
    with pytest.raises(jsonschema.ValidationError, match="intreval"):
        jsonschema.Draft202012Validator(schema).validate(broken)


@pytest.mark.parametrize("name", ALL)
def test_the_real_settings_loaders_accept_the_manifests(
    rendered: dict[str, list[Obj]], name: str, tmp_path: Path
) -> None:
    """Secrets and mounted files included: the token reaches both sides under the names the loaders read (an
    unknown POPGATE_* variable is ignored, so a renamed setting would leave the brokers open without this)."""
    from broker.settings import parse as broker_settings
    from proxy.settings import load as proxy_settings

    objs = rendered[name]
    brokers = one(objs, "StatefulSet", "popgate-broker")
    pods = [f"popgate-broker-{i}" for i in range(brokers["spec"]["replicas"])]
    env = {}
    for pod in pods:
        env = server_env(objs, brokers, tmp_path, pod=pod)
        settings = broker_settings([], env)
        assert settings.name == pod
    token = env["POPGATE_BROKER_TOKEN"]
    assert token in setting_values(settings), "the broker does not read its token"
    proxy = proxy_settings([], server_env(objs, one(objs, "Deployment", "popgate-proxy"), tmp_path))
    assert proxy.broker_srv and not proxy.brokers
    assert proxy.broker_token == token
    if name == "prod":  # accounts and TLS both ways (test_posture.py checks where they come from)
        assert proxy.accounts and proxy.tls_cert and proxy.tls_key and proxy.broker_tls_ca
        assert settings.tls_cert and settings.tls_key


def setting_values(settings: Any) -> list[Any]:
    return [getattr(settings, f.name) for f in dataclasses.fields(settings)]


MIB = 1024 * 1024
_UNITS = {"Ki": 1024, "Mi": MIB, "Gi": 1024 * MIB}


def memory_limit(workload: Obj) -> int:
    text = container(workload)["resources"]["limits"]["memory"]
    return int(text[:-2]) * _UNITS[text[-2:]]


@pytest.mark.parametrize("name", ALL)
def test_memory_limits_cover_what_the_servers_budgets_let_them_hold(
    rendered: dict[str, list[Obj]], name: str, tmp_path: Path
) -> None:
    """Twice the bytes a process lets in flight (a request is held about twice while handled: measured 1.7-2.4x)
    plus 128 MiB for the interpreter: the dev overlay's 512Mi under default budgets (448 MiB at a broker) was
    OOM-killed by sends it accepted (a review's probe)."""
    from broker.settings import parse as broker_settings
    from proxy.settings import load as proxy_settings

    objs = rendered[name]
    brokers = one(objs, "StatefulSet", "popgate-broker")
    b = broker_settings([], server_env(objs, brokers, tmp_path, pod="popgate-broker-0"))
    broker_need = 2 * (b.max_send_bytes + b.max_pop_answer_bytes) + b.cache_bytes + 128 * MIB
    assert broker_need <= memory_limit(brokers), f"broker: {broker_need / MIB:.0f} MiB"
    proxy = one(objs, "Deployment", "popgate-proxy")
    p = proxy_settings([], server_env(objs, proxy, tmp_path))
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
