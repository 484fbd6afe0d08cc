"""The production posture of the rendered manifests (issue 31, point 1).

Brokers hold the only copy of their messages: they must spread over nodes, keep their resources under
pressure (Guaranteed QoS, a PriorityClass) and start with nothing but their own disk. Secrets are referenced,
never shipped; the proxies serve TLS with a cert-manager certificate.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from decimal import Decimal
from pathlib import Path

import pytest

from .conftest import INSTALL_HINT, K8S, KUSTOMIZATIONS, ROOT
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
    secret_ref,
    selects,
    volumes,
    workloads,
)

ALL = tuple(KUSTOMIZATIONS)
DATA_PLANE = (("StatefulSet", "popgate-broker"), ("Deployment", "popgate-proxy"))
# Volumes a data-plane pod may use: none of them waits on shared storage to attach.
LOCAL_VOLUMES = {"emptyDir", "secret", "configMap", "projected", "downwardAPI"}
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_FACTORS = {None: 1, "m": Decimal("0.001"), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_FACTORS |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(text: str | int) -> Decimal:
    match = _QUANTITY.match(str(text))
    assert match, f"unreadable quantity {text!r}"
    return Decimal(match[1]) * _FACTORS[match[2]]


def qos_class(workload: Obj) -> str:
    """Kubernetes' QoS class of a pod (pkg/apis/core/helper/qos): Guaranteed when every container, init containers
    included, has cpu and memory limits and requests equal to them (a missing request defaults to its limit)."""
    guaranteed = True
    for c in all_containers(workload):
        limits = c.get("resources", {}).get("limits", {})
        requests = c.get("resources", {}).get("requests", {})
        for resource in ("cpu", "memory"):
            if resource not in limits:
                guaranteed = False
            elif quantity(requests.get(resource, limits[resource])) != quantity(limits[resource]):
                guaranteed = False
    return "Guaranteed" if guaranteed else "Burstable"


def documented_secrets() -> set[str]:
    """Secrets docs/DEPLOY.md tells the operator to create (`kubectl ... create secret generic NAME`)."""
    return set(re.findall(r"create secret generic ([a-z0-9-]+)", (ROOT / "docs" / "DEPLOY.md").read_text()))


@pytest.mark.parametrize("name", ALL)
def test_brokers_never_share_a_node_while_another_has_none(rendered: dict[str, list[Obj]], name: str) -> None:
    brokers = one(rendered[name], "StatefulSet", "popgate-broker")
    labels = brokers["spec"]["template"]["metadata"]["labels"]
    constraints = {c["topologyKey"]: c for c in pod_spec(brokers)["topologySpreadConstraints"]}
    hostname = constraints["kubernetes.io/hostname"]
    assert (hostname["maxSkew"], hostname["whenUnsatisfiable"]) == (1, "DoNotSchedule"), "a requirement"
    assert selects(hostname["labelSelector"], labels)
    assert hostname.get("nodeTaintsPolicy", "Ignore") == "Ignore", "a cordoned node must still count"
    # Zones where labelled: preferred, so that unlabelled nodes stay eligible.
    zone = constraints["topology.kubernetes.io/zone"]
    assert (zone["maxSkew"], zone["whenUnsatisfiable"]) == (1, "ScheduleAnyway")
    assert selects(zone["labelSelector"], labels)


@pytest.mark.parametrize("name", ALL)
def test_broker_pods_are_guaranteed_qos(rendered: dict[str, list[Obj]], name: str) -> None:
    brokers = one(rendered[name], "StatefulSet", "popgate-broker")
    assert qos_class(brokers) == "Guaranteed"
    if name == "prod":  # the memory the docs size the prod brokers by (docs/DEPLOY.md, "Memory")
        assert quantity(container(brokers)["resources"]["limits"]["memory"]) == 4 * 2**30


def test_qos_class_reads_requests_as_kubernetes_does(rendered: dict[str, list[Obj]]) -> None:
    brokers = json.loads(json.dumps(one(rendered["prod"], "StatefulSet", "popgate-broker")))
    container(brokers)["resources"]["requests"]["cpu"] = "2000m"  # the same as "2"
    assert qos_class(brokers) == "Guaranteed"
    pod_spec(brokers)["initContainers"][0]["resources"]["requests"]["memory"] = "32Mi"  # a sidecar counts too
    assert qos_class(brokers) == "Burstable"
    assert qos_class(one(rendered["prod"], "Deployment", "popgate-proxy")) == "Burstable"


def test_prod_brokers_have_a_priority_class(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["prod"]
    name = pod_spec(one(objs, "StatefulSet", "popgate-broker"))["priorityClassName"]
    priority = one(objs, "PriorityClass", name)
    # Above ordinary pods (0), below the system-* classes (2e9 and up) that keep nodes running.
    assert 0 < priority["value"] <= 1_000_000_000 and priority["globalDefault"] is False
    assert priority.get("preemptionPolicy", "PreemptLowerPriority") == "PreemptLowerPriority"
    assert "metadata" not in priority or "namespace" not in priority["metadata"]


@pytest.mark.parametrize("name", ALL)
def test_no_data_plane_pod_mounts_shared_storage(rendered: dict[str, list[Obj]], name: str) -> None:
    """A broker or proxy starts and serves with its own disk only: no ReadWriteMany claim (nor any claim but a
    broker's own ReadWriteOnce one), and nothing that runs before it but native sidecars."""
    objs = rendered[name]
    shared = {
        c["metadata"]["name"]
        for c in find(objs, "PersistentVolumeClaim")
        if set(c["spec"]["accessModes"]) & {"ReadWriteMany", "ReadOnlyMany"}
    }
    for kind, workload_name in DATA_PLANE:
        workload = one(objs, kind, workload_name)
        for volume in volumes(workload).values():
            if "claimTemplate" in volume:
                assert volume["claimTemplate"]["spec"]["accessModes"] == ["ReadWriteOnce"]
                continue
            sources = set(volume) - {"name"}
            assert sources <= LOCAL_VOLUMES, (workload_name, volume)
            assert volume.get("persistentVolumeClaim", {}).get("claimName") not in shared
        for c in pod_spec(workload).get("initContainers", []):
            assert c.get("restartPolicy") == "Always", f"{c['name']} would hold {workload_name} back"
    # The metrics volume belongs to the CronJob alone.
    (cronjob,) = find(objs, "CronJob")
    claims = {
        w["metadata"]["name"]: {
            v["persistentVolumeClaim"]["claimName"] for v in volumes(w).values() if "persistentVolumeClaim" in v
        }
        for w in workloads(objs)
    }
    assert claims == {w["metadata"]["name"]: set() for w in workloads(objs)} | {
        cronjob["metadata"]["name"]: {"popgate-export"}
    }


def test_prod_secrets_are_referenced_and_none_is_shipped(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["prod"]
    brokers = one(objs, "StatefulSet", "popgate-broker")
    proxies = one(objs, "Deployment", "popgate-proxy")
    # One Secret, one key, both sides of the proxy→broker token.
    token = secret_ref(container(brokers), "POPGATE_BROKER_TOKEN")
    assert secret_ref(container(proxies), "POPGATE_BROKER_TOKEN") == token
    # The accounts: a Secret mounted where POPGATE_CONFIG points.
    proxy_env = env_from_configmap(objs, proxies)
    config = proxy_env["POPGATE_CONFIG"]
    assert proxy_env["POPGATE_AUTH"] == "required"  # an emptied accounts file stops the proxy, never serves open
    acl_volume, _ = mount_of(proxies, container(proxies), config)
    acl_items = {i["key"]: i["path"] for i in acl_volume["secret"]["items"]}
    assert config.endswith("/" + acl_items["acl.toml"])
    # No values in the repository: the overlay renders no Secret; each one referenced is made by cert-manager or
    # created by the operator as docs/DEPLOY.md says.
    assert find(objs, "Secret") == []
    referenced = {token[0], acl_volume["secret"]["secretName"]}
    for workload in workloads(objs):
        referenced |= {v["secret"]["secretName"] for v in volumes(workload).values() if "secret" in v}
    issued = {c["spec"]["secretName"] for c in find(objs, "Certificate")}
    assert referenced - issued <= documented_secrets(), "document `kubectl create secret generic` for it"
    assert {"popgate-broker-token", "popgate-proxy-acl"} <= documented_secrets()


def test_the_accounts_example_holds_placeholders_the_proxy_refuses() -> None:
    """Copied unedited, acl.example.toml does not start a proxy whose public placeholder secrets let clients in;
    with its secrets filled in, it loads."""
    import tomllib

    from proxy.auth import PLACEHOLDER_PREFIX, accounts_from_config

    text = (K8S / "overlays" / "prod" / "acl.example.toml").read_text()
    entries = tomllib.loads(text)["acl"]
    assert entries and all(entry["secret_key"].startswith(PLACEHOLDER_PREFIX) for entry in entries)
    with pytest.raises(ValueError, match=r"^acl\[0\]: the secret_key of access key orders-service is a placeholder"):
        accounts_from_config(entries)  # what the proxy would load from it
    filled = tomllib.loads(text.replace(PLACEHOLDER_PREFIX, "a-random-secret-"))["acl"]
    assert len(accounts_from_config(filled)) == len(entries)


def test_the_walk_through_runs_with_the_example_accounts() -> None:
    """docs/DEPLOY.md "From an empty cluster to a scaled one", step 5: each `popgate` command, as the account it
    names, is one the proxy allows with acl.example.toml's accounts (proxy/auth.py's rules)."""
    import tomllib

    from proxy.auth import PLACEHOLDER_PREFIX, accounts_from_config, authorize

    text = (K8S / "overlays" / "prod" / "acl.example.toml").read_text().replace(PLACEHOLDER_PREFIX, "random-secret-")
    accounts = {a.access_key: a for a in accounts_from_config(tomllib.loads(text)["acl"])}
    doc = (ROOT / "docs" / "DEPLOY.md").read_text().replace("\\\n", " ")
    step = doc[doc.index("5. **A topic and a first message**") : doc.index("6. **Watch it**")]
    commands = re.findall(
        r"POPGATE_ACCESS_KEY=(\S+) POPGATE_SECRET_KEY=(?:<[^>]*>|\S+) +popgate (topic create|send|receive) (.*)", step
    )
    assert [command for _, command, _ in commands] == ["topic create", "send", "receive"]
    for key, command, rest in commands:
        account = accounts[key]  # KeyError: an account the example does not have
        words = shlex.split(rest)
        if command == "topic create":
            assert account.admin, key
        elif command == "send":
            authorize(account, publish=[words[-2]])  # TOPIC "Hello, world"
        else:
            authorize(account, subscribe=[words[-1]], group=words[words.index("-g") + 1])


def test_dev_generates_a_placeholder_token_both_sides_use(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["dev"]
    refs = {secret_ref(container(one(objs, *DATA_PLANE[0])), "POPGATE_BROKER_TOKEN")}
    refs.add(secret_ref(container(one(objs, *DATA_PLANE[1])), "POPGATE_BROKER_TOKEN"))
    ((secret_name, key),) = refs
    secret = one(objs, "Secret", secret_name)
    assert secret_name.startswith("popgate-broker-token-"), "content-hashed: a new token rolls both"
    assert "placeholder" in base64.b64decode(secret["data"][key]).decode()


def cert_manager_schema_validate(obj: Obj) -> None:
    try:
        import jsonschema
    except ImportError:
        pytest.fail(f"jsonschema is not installed: {INSTALL_HINT}", pytrace=False)
    schema = json.loads((Path(__file__).parent / "certmanager.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(obj)


def test_prod_proxies_serve_tls_from_a_cert_manager_certificate(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["prod"]
    for obj in [*find(objs, "Issuer"), *find(objs, "Certificate")]:
        cert_manager_schema_validate(obj)
    proxies = one(objs, "Deployment", "popgate-proxy")
    settings = env_from_configmap(objs, proxies)
    tls_volume, tls_mount = mount_of(proxies, container(proxies), settings["POPGATE_TLS_CERT"])
    assert settings["POPGATE_TLS_CERT"] == tls_mount["mountPath"] + "/tls.crt"
    assert settings["POPGATE_TLS_KEY"] == tls_mount["mountPath"] + "/tls.key"
    (certificate,) = [
        c for c in find(objs, "Certificate") if c["spec"]["secretName"] == tls_volume["secret"]["secretName"]
    ]
    spec = certificate["spec"]
    assert "server auth" in spec["usages"] and not spec.get("isCA")
    # Every name a client in the cluster may dial, the advertised one among them.
    namespace = proxies["metadata"]["namespace"]
    service = one(objs, "Service", "popgate-proxy")["metadata"]["name"]
    names = {
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    }
    assert names <= set(spec["dnsNames"])
    assert settings["POPGATE_ADVERTISE"].rpartition(":")[0] in spec["dnsNames"]
    # Issued by the namespace's CA, itself from a self-signed root.
    issuer = one(objs, "Issuer", spec["issuerRef"]["name"])
    (ca,) = [c for c in find(objs, "Certificate") if c["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]]
    assert ca["spec"]["isCA"] is True
    assert "selfSigned" in one(objs, "Issuer", ca["spec"]["issuerRef"]["name"])["spec"]
    # Readiness speaks TLS and verifies against the CA cert-manager writes beside the certificate.
    command = container(proxies)["readinessProbe"]["exec"]["command"]
    assert flag(command, "--tls-ca") == tls_mount["mountPath"] + "/ca.crt"
    assert flag(command, "--server-name") in spec["dnsNames"]
    assert command[-1] == f"127.0.0.1:{port(container(proxies), 'grpc')}"


def dns_name_matches(pattern: str, name: str) -> bool:
    """A certificate's DNS name against a host name, as TLS clients match them (a wildcard: one left label)."""
    if pattern.startswith("*."):
        label, _, rest = name.partition(".")
        return bool(label) and rest == pattern[2:]
    return pattern == name


def test_prod_proxies_reach_brokers_over_tls_verified_by_their_discovered_names(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["prod"]
    brokers, proxies = one(objs, "StatefulSet", "popgate-broker"), one(objs, "Deployment", "popgate-proxy")
    broker_env, proxy_env = env_from_configmap(objs, brokers), env_from_configmap(objs, proxies)
    tls_volume, tls_mount = mount_of(brokers, container(brokers), broker_env["POPGATE_TLS_CERT"])
    assert broker_env["POPGATE_TLS_KEY"] == tls_mount["mountPath"] + "/tls.key"
    (certificate,) = [
        c for c in find(objs, "Certificate") if c["spec"]["secretName"] == tls_volume["secret"]["secretName"]
    ]
    spec = certificate["spec"]
    assert "server auth" in spec["usages"] and not spec.get("isCA")
    # The name the proxy verifies is the SRV target discovery finds: <pod>.<service>.<namespace>.svc.cluster.local.
    service, namespace = brokers["spec"]["serviceName"], brokers["metadata"]["namespace"]
    for i in range(brokers["spec"]["replicas"] + 5):  # and the pods scaling up adds
        pod_name = f"popgate-broker-{i}.{service}.{namespace}.svc.cluster.local"
        assert any(dns_name_matches(pattern, pod_name) for pattern in spec["dnsNames"]), pod_name
    # The proxy trusts the CA that issued it (the same Issuer as its own certificate's, whose ca.crt it mounts).
    _, proxy_mount = mount_of(proxies, container(proxies), proxy_env["POPGATE_BROKER_TLS_CA"])
    assert proxy_env["POPGATE_BROKER_TLS_CA"] == proxy_mount["mountPath"] + "/ca.crt"
    proxy_certificate = [c for c in find(objs, "Certificate") if c["metadata"]["name"] == "popgate-proxy-tls"]
    assert [c["spec"]["issuerRef"] for c in proxy_certificate] == [spec["issuerRef"]]
    # Kubelet's grpc probe cannot speak TLS: the broker's readiness verifies it as a proxy would.
    command = container(brokers)["readinessProbe"]["exec"]["command"]
    assert flag(command, "--tls-ca") == tls_mount["mountPath"] + "/ca.crt"
    assert any(dns_name_matches(p, flag(command, "--server-name")) for p in spec["dnsNames"])
    assert command[-1] == f"127.0.0.1:{port(container(brokers), 'grpc')}"


def test_cert_manager_schema_rejects_a_typo(rendered: dict[str, list[Obj]]) -> None:
    import jsonschema

    (certificate, *_) = find(rendered["prod"], "Certificate")
    broken = json.loads(json.dumps(certificate))
    broken["spec"]["dnsName"] = ["x"]
    with pytest.raises(jsonschema.ValidationError):
        cert_manager_schema_validate(broken)


@pytest.mark.parametrize("name", ALL)
def test_each_workload_runs_the_image_built_for_it(rendered: dict[str, list[Obj]], name: str) -> None:
    """Brokers and proxies (and their sidecars): the server image, without Java; the CronJob: the Spark image."""
    registry = "registry.example.com/" if name == "prod" else ""
    expected = {"StatefulSet": "popgate", "Deployment": "popgate", "CronJob": "popgate-spark"}
    for workload in workloads(rendered[name]):
        for c in all_containers(workload):
            assert c["image"] == f"{registry}{expected[workload['kind']]}:0.1.0", (workload["metadata"]["name"], c)
