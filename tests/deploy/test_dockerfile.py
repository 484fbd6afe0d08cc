"""The Dockerfile cannot be built here (no container engine): check what it promises instead.

Two targets: `server` (brokers, proxies, the `popgate` command) and `spark` (the CronJob). What a stage holds is
what its own instructions and those of the stages it is built FROM or COPYs --from put there.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from .conftest import DEPLOY, ROOT
from .manifests import all_containers, pod_spec, workloads

DOCKERFILE = DEPLOY / "Dockerfile"
# The image each manifest name stands for (deploy/k8s/base/kustomization.yaml): the Dockerfile's target.
TARGETS = {"popgate": "server", "popgate-spark": "spark"}
JRE = re.compile(r"openjdk-\d+-jre|default-jre|temurin|\bjava\b", re.I)
SPARK = re.compile(r"pyspark|\[spark\]|matplotlib", re.I)


@dataclass
class Stage:
    name: str
    base: str
    steps: list[tuple[str, str]] = field(default_factory=list)


def instructions(text: str | None = None) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text() if text is None else text)  # join continued lines
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines if line and not line.startswith("#")
    ]


def stages(text: str | None = None) -> dict[str, Stage]:
    found: dict[str, Stage] = {}
    current: Stage | None = None
    for op, arg in instructions(text):
        if op == "FROM":
            base, _, name = arg.partition(" AS ")
            current = found[name.strip()] = Stage(name.strip(), base.strip())
        elif current is not None:
            current.steps.append((op, arg))
    return found


def lineage(name: str, all_stages: dict[str, Stage]) -> list[Stage]:
    """The stage and every stage its content comes from (FROM and COPY --from), once each."""
    seen: list[Stage] = []
    todo = [name]
    while todo:
        stage = all_stages[todo.pop()]
        if stage in seen:
            continue
        seen.append(stage)
        if stage.base in all_stages:
            todo.append(stage.base)
        for op, arg in stage.steps:
            source = re.search(r"--from=(\S+)|from=([^,\s]+)", arg) if op in ("COPY", "RUN") else None
            if source:
                todo.append(source[1] or source[2])
    return seen


def installs(stage_list: list[Stage]) -> list[str]:
    """What the RUN steps of these stages install (apt and pip command lines)."""
    return [arg for s in stage_list for op, arg in s.steps if op == "RUN" and re.search(r"apt-get install|pip ", arg)]


def final_user(stage: Stage, all_stages: dict[str, Stage]) -> str:
    users = [arg for s in reversed(lineage(stage.name, all_stages)) for op, arg in s.steps if op == "USER"]
    own = [arg for op, arg in stage.steps if op == "USER"]
    return (own or users)[-1]


def test_the_server_image_has_neither_java_nor_spark() -> None:
    all_stages = stages()
    chain = lineage("server", all_stages)
    assert "spark" not in {s.name for s in chain}
    for command in installs(chain):
        assert not JRE.search(command), command
        assert not SPARK.search(command), command
    assert not any(op == "ENV" and "JAVA_HOME" in arg for s in chain for op, arg in s.steps)
    # And what it installs is the project without extras.
    assert any(re.search(r"pip .*install .*/src$", command) for command in installs(chain))


def test_the_spark_image_adds_a_jre_and_pyspark() -> None:
    all_stages = stages()
    own = installs([all_stages["spark"]])
    assert any(re.search(r"openjdk-\d+-jre-headless", c) for c in own), "Spark needs a JRE"
    assert any(re.search(r"pip .*install .*\[spark\]", c) for c in own)
    assert any(op == "ENV" and "JAVA_HOME=" in arg for op, arg in all_stages["spark"].steps)
    assert all_stages["spark"].base == "server", "the Spark image shares the server image's layers"


def test_every_install_uses_the_lock_file() -> None:
    pips = [c for c in installs(list(stages().values())) if "pip " in c]
    assert pips
    for command in pips:
        assert "-c /src/deploy/constraints.txt" in command, command


def test_the_base_is_pinned_by_exact_tag_and_digest() -> None:
    args = dict(arg.partition("=")[::2] for op, arg in instructions() if op == "ARG" and "=" in arg)
    assert re.fullmatch(r"3\.11\.\d+-slim-(bookworm|trixie)", args["PYTHON_TAG"]), "an exact patch release"
    digest = args["PYTHON_DIGEST"].strip('"')
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
    assert "docker buildx imagetools inspect" in DOCKERFILE.read_text()
    all_stages = stages()
    external = [s.base for s in all_stages.values() if s.base not in all_stages]
    assert external == ["python:${PYTHON_TAG}${PYTHON_DIGEST:+@}${PYTHON_DIGEST}"], "one base, pinned"


def test_both_images_run_as_the_manifests_user(rendered: dict[str, list[dict[str, Any]]]) -> None:
    all_stages = stages()
    for target in TARGETS.values():
        uid, _, gid = final_user(all_stages[target], all_stages).partition(":")
        for workload in workloads(rendered["base"]):
            security = pod_spec(workload)["securityContext"]
            assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid)), target


def commands_of(target: str) -> set[str]:
    """The programs a target's image has: the project's entry points and the helper scripts COPYed to a bin."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = set(project["scripts"])
    for stage in lineage(target, stages()):
        for op, arg in stage.steps:
            if op == "COPY" and "/bin/" in arg.split()[-1]:
                found.add(arg.split()[-1].rsplit("/", 1)[1])
    return found


def test_manifest_commands_exist_in_the_image_each_runs(rendered: dict[str, list[dict[str, Any]]]) -> None:
    packages = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    for name, objs in rendered.items():
        for workload in workloads(objs):
            for c in all_containers(workload):
                image = c["image"].rsplit("/", 1)[-1].partition(":")[0]
                available = commands_of(TARGETS[image])
                commands = [c["command"]] + [
                    c[p]["exec"]["command"] for p in ("readinessProbe", "livenessProbe") if "exec" in c.get(p, {})
                ]
                for command in commands:
                    if command[0] == "python":
                        assert command[1] in ("-m", "-c"), (name, c["name"])
                        assert command[1] == "-c" or command[2] in packages
                    else:
                        assert command[0] in available, (name, c["name"], command[0])


def test_build_context_keeps_every_package_and_script() -> None:
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in setuptools["packages"]:
        top = package.split(".")[0]
        folder = setuptools["package-dir"].get(top, top)
        assert any(folder == entry or folder.startswith(entry + "/") for entry in allowed), package
    assert "pyproject.toml" in allowed
    assert "deploy/constraints.txt" in allowed  # the Dockerfile installs with it
    for op, arg in instructions():
        if op == "COPY" and not arg.startswith("--from") and "deploy/" in arg:
            source = next(a for a in arg.split() if a.startswith("deploy/"))
            assert any(source == e or source.startswith(e + "/") for e in allowed), source
            assert (ROOT / source).is_file(), source


def test_stage_parser_sees_a_jre_smuggled_into_the_server() -> None:
    bad = DOCKERFILE.read_text().replace(
        "FROM base AS server\n", "FROM base AS server\nRUN apt-get install -y openjdk-17-jre-headless\n"
    )
    assert any(JRE.search(c) for c in installs(lineage("server", stages(bad))))
