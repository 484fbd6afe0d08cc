"""The admin commands, `popgate stats` and `popgate dlq`, against the shared cluster: what they print and exit with."""

from __future__ import annotations

import json
import re
import subprocess
from concurrent import futures

import grpc
import pytest

from popgate import Producer, SimpleConsumer
from popgate.cli.admin import BROKERS_MISSING, Broker
from popgate.cli.cluster import Cluster
from popgate.cli.dlq import BODY_SHOWN, list_dead_letters
from popgate.cli.main import main
from popgate.cli.options import NOTHING_LISTENS
from tests.integration.sdk.conftest import drain
from tests.integration.sdk.popgate_up import POPGATE
from tests.integration.sdk.test_cli import brokers, name


def test_stats_shows_lag_per_topic_and_group(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    # Longer than rich's 80-column default for a pipe: still printed whole, on one line
    topic, group = name("cli-stats-" + "t" * 50), name("consumer-group-" + "g" * 50)
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
    other = name("cli-stats-other")
    with Producer(cluster.endpoint) as producer:
        producer.send(other, b"m")
    assert main(["stats", *brokers(cluster), "--group", group]) == 0
    out = capsys.readouterr().out
    assert topic in out and other not in out, out  # the stored-messages table too keeps to the group's topics


@pytest.mark.parametrize("separator", [",", " "])
def test_stats_and_dlq_list_find_the_brokers_in_the_proxys_variable(
    cluster: Cluster, separator: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a proxy pod (docs/DEPLOY.md) POPGATE_BROKER, the proxy's list, is set and POPGATE_BROKERS is not.
    Before, both commands failed there: "give at least one --broker"."""
    topic, group = name("cli"), name("g")
    with Producer(cluster.endpoint) as producer, SimpleConsumer(cluster.endpoint, group, topic) as consumer:
        producer.send(topic, b"poison pill")
        consumer.forward_to_dlq(drain(consumer, 1, ack=False)[0])
    monkeypatch.delenv("POPGATE_BROKERS", raising=False)
    monkeypatch.setenv("POPGATE_BROKER", separator.join(cluster.broker_targets()))
    assert main(["stats", "--topic", topic]) == 0
    assert "lag per topic and group (2 of 2 brokers)" in capsys.readouterr().out
    assert main(["dlq", "list", group]) == 0
    assert f"%DLQ%{group}: 1 message(s) not yet re-sent (1 stored)" in capsys.readouterr().out
    monkeypatch.setenv("POPGATE_BROKERS", "b9=127.0.0.1:1")  # the SDK's own variable comes first
    assert main(["stats", "--topic", topic, "--timeout", "0.5"]) == BROKERS_MISSING  # none answered
    err = capsys.readouterr().err
    assert "popgate stats: broker b9 at 127.0.0.1:1: UNAVAILABLE" in err and "1 of 1 brokers missing: b9" in err


def test_dlq_list_and_resend(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = name("cli"), name("g")
    endpoint = cluster.endpoint
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        receipt = producer.send(topic, b"poison pill", tag="bad", properties={"p": "v"})
        [message] = drain(consumer, 1, ack=False)
        consumer.forward_to_dlq(message)
    assert main(["dlq", "list", group, *brokers(cluster)]) == 0
    out = capsys.readouterr().out
    assert f"%DLQ%{group}: 1 message(s) not yet re-sent (1 stored)" in out
    assert receipt.message_id in out and topic in out and "poison pill" in out
    assert main(["dlq", "resend", group, "--endpoint", endpoint, "--wait", "2"]) == 0
    assert f"resent 1 message(s) from %DLQ%{group}: 1 to {topic}" in capsys.readouterr().err
    # re-sent: no longer listed (nor counted by popgate_broker_dlq_messages), but still stored
    assert main(["dlq", "list", group, *brokers(cluster)]) == 0
    out = capsys.readouterr().out
    assert f"%DLQ%{group}: 0 message(s) not yet re-sent (1 stored)" in out and "poison pill" not in out
    assert main(["dlq", "list", group, "--all", *brokers(cluster)]) == 0
    out = capsys.readouterr().out
    assert f"%DLQ%{group}: 1 message(s) stored (0 not yet re-sent)" in out and "poison pill" in out
    with SimpleConsumer(endpoint, group, topic) as consumer:
        [back] = drain(consumer, 1)
    assert (back.body, back.tag, dict(back.properties)) == (b"poison pill", "bad", {"p": "v"})
    assert main(["dlq", "resend", group, "--endpoint", endpoint, "--wait", "0.5"]) == 0
    assert "resent 0 message(s)" in capsys.readouterr().err  # each dead letter is re-sent once


def test_dlq_list_shows_a_bodys_control_characters_escaped(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A producer's body may hold terminal escape sequences (set the window title, clear the screen): listed, they
    are shown as \\xNN, as `popgate receive` shows them, and never reach the operator's terminal."""
    topic, group = name("cli"), name("g")
    body = b"\x1b]0;title\x07\x1b[2Jafter"
    with Producer(cluster.endpoint) as producer, SimpleConsumer(cluster.endpoint, group, topic) as consumer:
        producer.send(topic, body, tag="t\u00a0x")
        consumer.forward_to_dlq(drain(consumer, 1, ack=False)[0])
    assert main(["dlq", "list", group, *brokers(cluster)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out, out
    assert "\\x1b]0;title\\x07\\x1b[2Jafter" in out and "t\u00a0x" in out


def test_dlq_list_shows_dead_letters_larger_than_grpcs_default_message_limit(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three 3 MiB dead letters: the broker's list page is cut at its 8 MiB answer budget and `dlq list` asks
    for the rest. Before, one answer held all three (9 MiB) and the admin's 4 MiB channel refused it: "broker ...:
    RESOURCE_EXHAUSTED", no broker answered."""
    topic, group = name("cli"), name("g")
    bodies = [bytes([65 + i]) * (3 * 1024 * 1024) for i in range(3)]
    with Producer(cluster.endpoint) as producer, SimpleConsumer(cluster.endpoint, group, topic) as consumer:
        for body in bodies:
            producer.send(topic, body)
        for message in drain(consumer, 3, ack=False):
            consumer.forward_to_dlq(message)
    assert main(["dlq", "list", group, *brokers(cluster)]) == 0
    out = capsys.readouterr().out
    assert f"%DLQ%{group}: 3 message(s)" in out
    assert all(body[:40].decode() in out for body in bodies)
    listed = list_dead_letters([Broker(*t.split("=")) for t in cluster.broker_targets()], group, limit=10, timeout=5)
    assert sorted(s.message.body for s in listed.messages) == [body[:BODY_SHOWN] for body in bodies]  # 40 B held each


def test_stats_names_the_error_a_broker_answered_with(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """A server that answers, but with an error (here: no Broker service at all), is not 'did not answer'."""
    other = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = other.add_insecure_port("127.0.0.1:0")
    other.start()
    try:
        argv = ["stats", *brokers(cluster), "--broker", f"x9=127.0.0.1:{port}", "--broker", "x0=127.0.0.1:1"]
        assert main([*argv, "--timeout", "2"]) == BROKERS_MISSING
    finally:
        other.stop(None)
    captured = capsys.readouterr()
    assert f"popgate stats: broker x9 at 127.0.0.1:{port}: UNIMPLEMENTED (not a popgate broker" in captured.err
    assert "popgate stats: broker x0 at 127.0.0.1:1: UNAVAILABLE" in captured.err
    assert "did not answer" not in captured.err and "(2 of 4 brokers)" in captured.out


def test_dlq_list_fails_when_no_broker_answers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dlq", "list", "g", "--broker", "b1=127.0.0.1:1", "--timeout", "0.5"]) == 1
    err = capsys.readouterr().err
    assert "popgate dlq list: broker b1 at 127.0.0.1:1: UNAVAILABLE" in err
    assert "no broker answered" in err


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["stats", "-e", "BROKER"], 1),  # a broker is no proxy: its admin service is not there
        (["dlq", "list", "g", "-e", "BROKER"], 1),
        (["dlq", "list", "g", "--broker", "b1=127.0.0.1:1", "--timeout", "0.5", "--endpoint", ""], 1),
        (["topic", "create", "x", "-e", "BROKER"], 1),
        (["group", "consumers", "g", "-e", "BROKER"], 1),
        (["group", "reset", "g", "-t", "no-such-topic", "--earliest", "--yes", "-e", "PROXY"], 1),  # on no broker
        (["stats", "-e", "127.0.0.1:1"], NOTHING_LISTENS),
    ],
)
def test_json_is_one_document_with_the_error_when_nothing_answered(
    argv: list[str], code: int, cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    addresses = {"BROKER": cluster.brokers["b1"].address, "PROXY": cluster.endpoint}
    assert main([addresses.get(arg, arg) for arg in argv] + ["--json"]) == code
    captured = capsys.readouterr()
    error = captured.err.strip().splitlines()[-1]
    assert json.loads(captured.out) == {"error": error}, captured


def test_stats_in_an_80_column_terminal_folds_the_names_and_keeps_the_numbers(
    cluster: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, group = name("order-events-production-eu-west"), name("billing-service-consumers")
    with Producer(cluster.endpoint) as producer, SimpleConsumer(cluster.endpoint, group, topic) as consumer:
        producer.send_many(topic, [b"m"] * 12)
        consumer.receive(max=1, wait=5)  # one in flight, not acked
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich's terminal, as a user's: 80 columns
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["stats", *brokers(cluster), "--group", group]) == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert max(len(line) for line in text.splitlines()) <= 80
    header = next(line for line in text.splitlines() if "lag" in line and "inflight" in line)
    assert "oldest un-acked" in header, text
    row = next(line for line in text.splitlines() if line.startswith("│ order-even"))
    assert [c.strip() for c in row.strip("│ ").split("│")][2:5] == ["12", "11", "1"], repr(row)  # lag ready inflight


def test_stats_into_a_closed_pipe_exits_141_not_1_which_means_no_broker_answered(cluster: Cluster) -> None:
    """`popgate stats | head -1` exited 1 (rich's own exit on EPIPE): under `set -o pipefail`, "no broker answered"."""
    proc = subprocess.Popen([POPGATE, "stats", *brokers(cluster)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before the table is written
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 141, err
