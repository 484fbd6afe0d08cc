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
