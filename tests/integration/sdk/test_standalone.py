"""The SDK installed alone (sdk/pyproject.toml: grpcio and protobuf only) produces and consumes through a real
cluster, and importing it loads no broker, proxy, command or process plumbing and changes nothing process-wide."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import json, os, sys, uuid
before = dict(os.environ)
import popgate
changed_on_import = sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k))
from popgate import Producer, SimpleConsumer

topic, group = "standalone-" + uuid.uuid4().hex[:8], "g-" + uuid.uuid4().hex[:8]
with Producer(sys.argv[1]) as producer, SimpleConsumer(sys.argv[1], group, topic) as consumer:
    consumer.receive(max=1, wait=0.2)  # the group starts at the queue's end: subscribe before sending
    sent = {producer.send(topic, f"m{i}".encode(), tag="t").message_id for i in range(3)}
    got = []
    for _ in range(50):
        batch = consumer.receive(max=16, wait=0.5)
        consumer.ack_many(batch)
        got += batch
        if len(got) >= 3:
            break
loaded = sorted({name.split(".")[0] for name in sys.modules} | {n for n in sys.modules if n.startswith("popgate.")})
print(json.dumps({
    "sent": sorted(sent),
    "received": sorted(m.message_id for m in got),
    "tags": sorted({m.tag for m in got}),
    "loaded": loaded,
    "changed_on_import": changed_on_import,
    "file": popgate.__file__,
}))
"""


# The venv's pip install has 300 s of its own (a loaded host: past the suite's 120 s).
pytestmark = pytest.mark.timeout(360)


@pytest.fixture(scope="module")
def sdk_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with only the SDK's distribution installed (built from a copy: the checkout stays clean)."""
    base = tmp_path_factory.mktemp("standalone")
    source = base / "src"
    skip = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    shutil.copytree(ROOT / "sdk", source / "sdk", ignore=skip)
    shutil.copytree(ROOT / "proto", source / "proto", ignore=skip)
    venv.create(base / "venv", with_pip=True)
    python = base / "venv" / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run(
        [*install, "-c", str(ROOT / "deploy" / "constraints.txt"), str(source / "sdk")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def installed(python: Path) -> set[str]:
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return {d["name"].lower().replace("_", "-") for d in json.loads(listing.stdout)}


def test_the_sdk_distribution_brings_grpcio_and_protobuf_only(sdk_python: Path) -> None:
    # grpcio's own dependency (typing-extensions) and the venv's pip/setuptools aside.
    assert installed(sdk_python) - {"pip", "setuptools", "typing-extensions"} == {
        "popgate-client",
        "grpcio",
        "protobuf",
    }


def test_a_producer_and_a_consumer_work_from_the_sdk_alone(sdk_python: Path, endpoint: str, tmp_path: Path) -> None:
    # A user's folder named sdk (this repository's own folder name) beside the script shadows nothing.
    (tmp_path / "sdk").mkdir()
    (tmp_path / "sdk" / "__init__.py").write_text("raise ImportError('the user folder was imported')\n")
    (tmp_path / "app.py").write_text(SCRIPT)
    done = subprocess.run(
        [str(sdk_python), "app.py", endpoint], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["received"] == out["sent"] and len(out["sent"]) == 3
    assert out["tags"] == ["t"]
    assert out["changed_on_import"] == []
    assert "site-packages" in out["file"]
    forbidden = {"broker", "proxy", "popgate_process", "popgate.cli", "spark_metrics", "prometheus_client", "rich"}
    assert forbidden.isdisjoint(out["loaded"]), sorted(forbidden & set(out["loaded"]))
    assert {"popgate", "popgate_contract", "popgate_pb", "grpc"} <= set(out["loaded"])


def test_importing_the_sdk_in_this_process_changes_no_environment() -> None:
    code = "import os; before = dict(os.environ); from popgate import Producer; print(os.environ == before)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True, env={"PATH": "/usr/bin"}
    )
    assert done.stdout.strip() == "True"


def test_the_installed_sdk_is_typed_for_its_users_type_checkers(sdk_python: Path) -> None:
    """PEP 561: without `py.typed` a user's mypy takes every `popgate` value for `Any` and checks nothing."""
    code = "import importlib.util as u, pathlib as p; print(all((p.Path(u.find_spec(n).origin).parent / 'py.typed')"
    code += ".is_file() for n in ('popgate', 'popgate_contract', 'popgate_pb')))"
    done = subprocess.run([str(sdk_python), "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "True"
