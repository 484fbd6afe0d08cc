"""Helpers to look things up in rendered manifests."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(obj: Obj) -> Obj:
    spec = obj["spec"]
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return spec["template"]["spec"]


def workloads(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] in ("StatefulSet", "Deployment", "CronJob")]


def container(obj: Obj) -> Obj:
    (only,) = pod_spec(obj)["containers"]
    return only


def all_containers(obj: Obj) -> list[Obj]:
    """Init containers (native sidecars among them) and containers."""
    spec = pod_spec(obj)
    return [*spec.get("initContainers", []), *spec["containers"]]


def sidecar(obj: Obj, name: str) -> Obj:
    """A native sidecar: an init container that keeps running beside the containers."""
    (found,) = [c for c in pod_spec(obj).get("initContainers", []) if c["name"] == name]
    assert found.get("restartPolicy") == "Always", f"{name} is not a sidecar"
    return found


def flag(command: list[str], name: str) -> str:
    """The value after `name` in an argument list."""
    return command[command.index(name) + 1]


def secret_ref(c: Obj, variable: str) -> tuple[str, str]:
    """(Secret name, key) a container's environment variable comes from."""
    (item,) = [e for e in c.get("env", []) if e["name"] == variable]
    ref = item["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def volumes(workload: Obj) -> dict[str, Obj]:
    """A pod's volumes by name; a StatefulSet's claim templates as {"name", "claimTemplate"}."""
    found = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    for claim in workload["spec"].get("volumeClaimTemplates", []):
        found[claim["metadata"]["name"]] = {"name": claim["metadata"]["name"], "claimTemplate": claim}
    return found


def mount_of(workload: Obj, c: Obj, path: str) -> tuple[Obj, Obj]:
    """(volume, mount) of a container under which `path` lies (the deepest mount wins)."""
    mounts = [m for m in c.get("volumeMounts", []) if path == m["mountPath"] or path.startswith(m["mountPath"] + "/")]
    assert mounts, f"{path} is on no volume of {c['name']}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    return volumes(workload)[mount["name"]], mount


def port(c: Obj, name: str) -> int:
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == name]
    return int(number)


def env_from_configmap(objs: list[Obj], workload: Obj) -> dict[str, str]:
    data: dict[str, str] = {}
    for source in container(workload).get("envFrom", []):
        data |= one(objs, "ConfigMap", source["configMapRef"]["name"])["data"]
    return data


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        value, op, values = labels.get(expr["key"]), expr["operator"], expr.get("values", [])
        matched = {
            "In": value in values,
            "NotIn": value not in values,
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }[op]
        if not matched:
            return False
    return True
