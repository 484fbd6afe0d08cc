"""The environment and files a server container starts with, so the real settings loaders can read them.

ConfigMaps, literal values and fieldRefs come from the rendered manifests. A Secret the overlay renders (the
dev token) gives its own value; one created out of band (prod: docs/DEPLOY.md "Secrets") a stand-in naming it.
Secret volumes become files under a temporary directory, and variables pointing into them point there: the
accounts file from its example in the repository with its placeholder secrets filled in (as the operator does),
certificates as stand-ins (the loader checks they exist).
"""

from __future__ import annotations

import base64
from pathlib import Path

from proxy.auth import PLACEHOLDER_PREFIX

from .conftest import K8S
from .manifests import Obj, container, env_from_configmap, find, pod_spec

# The example a Secret's key is written from, for Secrets the repository ships only as an example.
EXAMPLES = {("popgate-proxy-acl", "acl.toml"): K8S / "overlays" / "prod" / "acl.example.toml"}
# What an operator writes over an example's placeholder secrets (the proxy refuses those: proxy/auth.py).
FILLED_IN = "stand-in-random-"
# The keys cert-manager writes into a certificate's Secret (type kubernetes.io/tls).
TLS_KEYS = ("tls.crt", "tls.key", "ca.crt")


def stand_in(name: str, key: str) -> str:
    return f"stand-in-for-{name}-{key}"


def secret_value(objs: list[Obj], name: str, key: str) -> str:
    """The rendered Secret's value (kustomize wrote it base64-encoded), or a stand-in when none is rendered."""
    for secret in find(objs, "Secret", name):
        if key in secret.get("data", {}):
            return base64.b64decode(secret["data"][key]).decode()
        return str(secret["stringData"][key])
    return stand_in(name, key)


def _secret_files(objs: list[Obj], volume: Obj, into: Path) -> None:
    source = volume["secret"]
    name = source["secretName"]
    keys = [(item["key"], item["path"]) for item in source.get("items", [])] or [(k, k) for k in TLS_KEYS]
    into.mkdir(parents=True, exist_ok=True)
    for key, path in keys:
        example = EXAMPLES.get((name, key))
        text = example.read_text().replace(PLACEHOLDER_PREFIX, FILLED_IN) if example else None
        (into / path).write_text(text or secret_value(objs, name, key))


def server_env(objs: list[Obj], workload: Obj, tmp_path: Path, *, pod: str = "") -> dict[str, str]:
    """The POPGATE_* environment of `workload`'s server container, as the pod named `pod` would see it."""
    c = container(workload)
    env = env_from_configmap(objs, workload)
    for item in c.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item["valueFrom"]:
            assert item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
            env[item["name"]] = pod
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = secret_value(objs, ref["name"], ref["key"])
    volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
    for mount in c.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        if "secret" not in volume:
            continue
        local = tmp_path / workload["metadata"]["name"] / mount["name"]
        _secret_files(objs, volume, local)
        for variable, value in env.items():
            if value.startswith(mount["mountPath"] + "/"):
                env[variable] = str(local / value.removeprefix(mount["mountPath"] + "/"))
    return env
