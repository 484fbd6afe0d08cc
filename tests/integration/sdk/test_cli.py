"""Each `popgate` client command against the shared cluster prints what it says."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import pytest

from sdk import Producer, SimpleConsumer
from sdk.cli import main
from sdk.cluster import Cluster
from tests.integration.sdk.conftest import drain


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")  # rich tables: no wrapped ids


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def brokers(cluster: Cluster) -> list[str]:
    return [arg for target in cluster.broker_targets() for arg in ("--broker", target)]


def test_send_from_argument_file_stdin_and_generated(
    endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = name("cli")
    assert main(["send", "--endpoint", endpoint, topic, "hello", "--tag", "greeting", "--key", "k1"]) == 0
    out = capsys.readouterr().out
    assert f"sent 1 message (5 B) to {topic}" in out
    message_id = out.split()[0]
    body = tmp_path / "body.bin"
    body.write_bytes(b"from a file")
    assert main(["send", "--endpoint", endpoint, topic, "--file", str(body)]) == 0
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"from stdin")))
    assert main(["send", "--endpoint", endpoint, topic, "-"]) == 0
    assert main(["send", "--endpoint", endpoint, topic, "--count", "300", "--size", "64", "--rate", "3000"]) == 0
    out = capsys.readouterr().out
    assert f"sent 300 messages (64 B each) to {topic}" in out
    with SimpleConsumer(endpoint, name("g"), topic) as consumer:
        got = drain(consumer, 303)
    bodies = [m.body for m in got]
    assert {b"hello", b"from a file", b"from stdin"} <= set(bodies)
    assert sum(len(b) == 64 for b in bodies) == 300
    hello = next(m for m in got if m.body == b"hello")
    assert (hello.message_id, hello.tag, tuple(hello.keys)) == (message_id, "greeting", ("k1",))


def test_receive_prints_messages_acks_or_not(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = name("cli"), name("g")
    with Producer(endpoint) as producer:
        sent = producer.send_many(topic, [b"one", b"two", b"three"], tag="x")
    argv = ["receive", "--endpoint", endpoint, topic, "--group", group, "--wait", "3", "--count", "3"]
    assert main([*argv, "--format", "json", "--no-ack", "--invisible", "1"]) == 0
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert sorted(r["body"] for r in records) == ["one", "three", "two"]
    assert {r["message_id"] for r in records} == {r.message_id for r in sent}
    assert {r["attempt"] for r in records} == {1} and {r["tag"] for r in records} == {"x"}
    assert f"received 3 messages from {topic} (group {group})" in captured.err
    # not acked: they come back after --invisible, now with attempt 2, and this time they are acked
    assert main([*argv, "--format", "text"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("attempt=2") == 3
    assert f"received and acked 3 messages from {topic}" in captured.err
    assert main([*argv[:-2], "--wait", "0.5"]) == 0
    assert "received and acked 0 messages" in capsys.readouterr().err


def test_stats_shows_lag_per_topic_and_group(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = name("cli"), name("g")
    with Producer(cluster.endpoint) as producer, SimpleConsumer(cluster.endpoint, group, topic) as consumer:
        producer.send_many(topic, [b"m"] * 10)
        acked = len(drain(consumer, 4))  # a receive may bring more than 4: all of them are acked
    assert main(["stats", *brokers(cluster), "--topic", topic]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if group in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[:5] == [topic, group, str(10 - acked), str(10 - acked), "0"]  # topic group lag ready inflight
    assert "lag per topic and group (2 of 2 brokers)" in out
    assert any(topic in line and "10" in line for line in out.splitlines() if group not in line)


def test_dlq_list_and_resend(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = name("cli"), name("g")
    endpoint = cluster.endpoint
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        receipt = producer.send(topic, b"poison pill", tag="bad", properties={"p": "v"})
        [message] = drain(consumer, 1, ack=False)
        consumer.forward_to_dlq(message)
    assert main(["dlq", "list", group, *brokers(cluster)]) == 0
    out = capsys.readouterr().out
    assert f"%DLQ%{group}: 1 message(s)" in out
    assert receipt.message_id in out and topic in out and "poison pill" in out
    assert main(["dlq", "resend", group, "--endpoint", endpoint, "--wait", "2"]) == 0
    assert f"resent 1 message(s) from %DLQ%{group}: 1 to {topic}" in capsys.readouterr().out
    with SimpleConsumer(endpoint, group, topic) as consumer:
        [back] = drain(consumer, 1)
    assert (back.body, back.tag, dict(back.properties)) == (b"poison pill", "bad", {"p": "v"})
    assert main(["dlq", "resend", group, "--endpoint", endpoint, "--wait", "0.5"]) == 0
    assert "resent 0 message(s)" in capsys.readouterr().out  # each dead letter is re-sent once


def test_bench_prints_a_summary_table(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--endpoint", endpoint, "--count", "600", "--batch", "100", "--samples", "3"]) == 0
    out = capsys.readouterr().out
    assert "popgate bench via" in out
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert {"produce", "consume+ack", "idle wake"} <= set(lines)
    assert "600" in lines["produce"] and "600" in lines["consume+ack"] and "3" in lines["idle wake"]
