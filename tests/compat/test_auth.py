"""The official rocketmq-python-client 5.1.2 (in a subprocess) against a proxy with [[acl]] accounts.

Its route errors are swallowed: a failed QueryRoute is only logged ("query topic raise
exception, 40100, ...") and the send then raises a generic "failed to fetch topic route".
So for a wrong secret the driver reports both, and the test looks for the code there;
a valid key without the permission gets past the route and raises ForbiddenException(40300).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate.cli.cluster import Cluster
from tests.procs import secured_cluster

if importlib.util.find_spec("rocketmq") is None:
    raise RuntimeError("rocketmq-python-client is required (the dev extra installs it: make test)")

CONFIG = """
broker_token = "broker-secret"

[[acl]]
access_key = "alice"
secret_key = "alice-secret-0123456"
publish = ["compat-auth-*"]
subscribe = ["compat-auth-*"]
groups = ["billing"]

[[acl]]
access_key = "reader"
secret_key = "reader-secret-0123456"
subscribe = ["*"]
groups = ["*"]
"""

# Runs in its own process: the client's protobuf classes must never load into pytest's.
DRIVER = r"""
import json, logging, sys, time
from rocketmq import ClientConfiguration, Credentials, Message, Producer, SimpleConsumer, FilterExpression

scenario, endpoint, ak, sk, topic, group = sys.argv[1:7]
logged = []
class Keep(logging.Handler):
    def emit(self, record):
        logged.append(record.getMessage())
logging.getLogger("rocketmq-python-client").addHandler(Keep())
config = ClientConfiguration(endpoint, Credentials(ak, sk), request_timeout=5)

def message(body):
    m = Message()
    m.topic = topic
    m.body = body
    return m

def outcome(action):
    try:
        return {"ok": action()}
    except Exception as exc:
        return {"error": str(exc), "code": getattr(exc, "code", None),
                "logged": [line for line in logged if "exception" in line]}

if scenario == "send_receive":
    producer = Producer(config, (topic,)); producer.startup()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression("*")}, await_duration=2); consumer.startup()
    try:
        for i in range(3):
            producer.send(message(f"m{i}".encode()))
        got, end = [], time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < end:
            batch = consumer.receive(32, 15)
            for m in batch:
                consumer.ack(m)
            got += batch
        beats, end = [], time.monotonic() + 15  # its first heartbeat (it names the group) comes 1 s after start
        while not beats and time.monotonic() < end:
            beats = [line for line in logged if "heartbeat" in line and str(consumer) in line]
            time.sleep(0.1)
        result = {"received": sorted(m.body.decode() for m in got), "heartbeat_ok": bool(beats) and all(
            line.endswith("success.") for line in beats)}
    finally:
        producer.shutdown(); consumer.shutdown()
elif scenario == "send":
    producer = Producer(config, (topic,)); producer.startup()
    try:
        result = outcome(lambda: producer.send(message(b"x")).message_id)
    finally:
        producer.shutdown()
else:
    consumer = SimpleConsumer(config, group, {topic: FilterExpression("*")}, await_duration=1); consumer.startup()
    try:
        result = outcome(lambda: len(consumer.receive(1, 15)))
    finally:
        consumer.shutdown()
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with secured_cluster(tmp_path_factory.mktemp("compat-auth"), CONFIG) as started:
        yield started


def drive(cluster: Cluster, tmp_path: Path, scenario: str, ak: str, sk: str, group: str, tz: str = "UTC") -> object:
    driver = tmp_path / "auth_driver.py"
    driver.write_text(DRIVER)
    topic = f"compat-auth-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, HOME=str(tmp_path), TZ=tz)  # the client logs under ~/logs; TZ moves its "Z" date
    done = subprocess.run(
        [sys.executable, str(driver), scenario, cluster.endpoint, ak, sk, topic, group],
        capture_output=True,
        env=env,
        timeout=90,
        check=False,
    )
    out = done.stdout.decode(errors="replace")
    assert done.returncode == 0, f"{scenario} failed:\n{out}\n{done.stderr.decode(errors='replace')[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("tz", ["Asia/Kathmandu", "America/St_Johns"])  # UTC+5:45, UTC-3:30/-2:30
def test_right_keys_work_from_a_client_whose_local_time_is_not_utc(cluster: Cluster, tmp_path: Path, tz: str) -> None:
    result = drive(cluster, tmp_path, "send_receive", "alice", "alice-secret-0123456", "billing", tz=tz)
    assert result == {"received": ["m0", "m1", "m2"], "heartbeat_ok": True}  # the group's heartbeat: its rights


@pytest.mark.parametrize(("ak", "sk"), [("alice", "wrong"), ("", "")])
def test_a_wrong_secret_or_no_credentials_is_unauthorized_40100(
    cluster: Cluster, tmp_path: Path, ak: str, sk: str
) -> None:
    result = drive(cluster, tmp_path, "send", ak, sk, "billing")
    assert isinstance(result, dict) and "ok" not in result
    assert any("40100" in line for line in result["logged"]), result


def test_a_valid_key_without_publish_is_forbidden_40300(cluster: Cluster, tmp_path: Path) -> None:
    result = drive(cluster, tmp_path, "send", "reader", "reader-secret-0123456", "billing")
    assert isinstance(result, dict) and result.get("code") == 40300, result


def test_a_valid_key_receiving_as_another_group_is_forbidden_40300(cluster: Cluster, tmp_path: Path) -> None:
    result = drive(cluster, tmp_path, "receive", "alice", "alice-secret-0123456", "other-group")
    assert isinstance(result, dict) and result.get("code") == 40300, result
