"""The Dockerfile cannot be built here (no container engine): check what it promises instead."""

from __future__ import annotations

import re
import tomllib
from typing import Any

from .conftest import DEPLOY, ROOT
from .manifests import container, pod_spec, workloads

DOCKERFILE = DEPLOY / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())  # join continued lines
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines if line and not line.startswith("#")
    ]


def test_one_slim_python_image_running_as_the_manifests_user(rendered: dict[str, list[dict[str, Any]]]) -> None:
    steps = instructions()
    froms = [arg for op, arg in steps if op == "FROM"]
    assert len(froms) == 1 and froms[0].startswith("python:3.11-slim")
    (user,) = [arg for op, arg in steps if op == "USER"]
    uid, _, gid = user.partition(":")
    for workload in workloads(rendered["base"]):
        security = pod_spec(workload)["securityContext"]
        assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid))
    assert any(op == "RUN" and "openjdk-" in arg and "jre-headless" in arg for op, arg in steps), "Spark needs a JRE"
    assert any(op == "RUN" and re.search(r"pip install .*\[spark\]", arg) for op, arg in steps)


def test_manifest_commands_are_installed_entry_points(rendered: dict[str, list[dict[str, Any]]]) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    scripts = set(project["scripts"])
    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for workload in workloads(rendered["base"]):
        command = container(workload)["command"]
        if command[0] == "python":
            assert command[1] == "-m" and command[2] in packages
        else:
            assert command[0] in scripts


def test_build_context_keeps_every_package() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in setuptools["packages"]:
        top = package.split(".")[0]
        folder = setuptools["package-dir"].get(top, top)
        assert any(folder == entry or folder.startswith(entry + "/") for entry in allowed), package
    assert "pyproject.toml" in allowed
    assert "deploy/constraints.txt" in allowed  # the Dockerfile installs with it
