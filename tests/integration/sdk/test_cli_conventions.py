"""The `popgate` command's conventions against the shared cluster: short flags and units that reach the server,
`--json` documents parsed whole, and a fast, clear failure when nothing listens at the endpoint."""

from __future__ import annotations

import json
import socket
import time

import pytest

from popgate import Producer, RetryPolicy, SimpleConsumer, Unavailable
from popgate.cli.cluster import Cluster
from popgate.cli.main import main
from popgate.cli.options import NOTHING_LISTENS
from tests.integration.sdk.conftest import drain
from tests.integration.sdk.test_cli import brokers, name


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    "argv",
    [
        ["send", "t", "x"],
        ["receive", "t", "-g", "g"],
        ["dlq", "resend", "g"],
        ["bench", "-n", "10"],
    ],
)
def test_nothing_listening_fails_at_once_with_one_line_and_its_exit_code(
    argv: list[str], closed_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The SDK retried a refused connection for ~4 s before the command said anything."""
    started = time.monotonic()
    assert main([*argv, "-e", f"127.0.0.1:{closed_port}"]) == NOTHING_LISTENS
    took = time.monotonic() - started
    err = capsys.readouterr().err
    command = " ".join(argv[:2] if argv[0] == "dlq" else argv[:1])
    assert err == (
        f"popgate {command}: nothing listens at 127.0.0.1:{closed_port} (connection refused): is the proxy running?"
        " (--endpoint, POPGATE_ENDPOINT)\n"
    )
    assert took < 2.5, took  # no retries: the SDK's back-offs alone add up to 2.6 s or more


def test_the_sdk_still_treats_a_refused_connection_as_transient(closed_port: int) -> None:
    """A running program rides out a proxy restart: the SDK's error stays retriable (it retries it)."""
    with Producer(f"127.0.0.1:{closed_port}", retry=RetryPolicy(max_attempts=1)) as producer:
        with pytest.raises(Unavailable) as info:
            producer.send("t", b"x")
    assert info.value.retriable


def test_short_flags_and_units_reach_the_server(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = name("short"), name("g")
    assert main(["send", "-e", endpoint, "-n", "5", "-b", "2", "-q", topic, "--random-size", "1KiB"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # -q: no summary
    argv = ["receive", "-e", endpoint, topic, "-g", group, "-n", "5", "-w", "3s", "-b", "4", "--format", "json"]
    assert main([*argv, "--invisible", "1m"]) == 0
    captured = capsys.readouterr()
    records = [json.loads(line) for line in captured.out.splitlines()]
    assert len(records) == 5 and {len(r["body"]) for r in records} == {1024}
    assert f"received and acked 5 messages from {topic} (group {group})" in captured.err
    started = time.monotonic()
    assert main(["receive", "-e", endpoint, topic, "-g", group, "-w", "500ms", "-q"]) == 0  # nothing left
    assert time.monotonic() - started < 10 and capsys.readouterr() == ("", "")


def test_send_message_group_sends_a_fifo_message(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    topic = name("fifo")
    assert main(["send", "-e", endpoint, topic, "in order", "--message-group", "customer-7"]) == 0
    capsys.readouterr()
    with SimpleConsumer(endpoint, name("g"), topic) as consumer:
        [message] = drain(consumer, 1)
    assert (message.body, message.message_group) == (b"in order", "customer-7")


def test_stats_dlq_list_and_bench_print_one_json_document(cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic, group = name("json"), name("g")
    with Producer(cluster.endpoint) as producer, SimpleConsumer(cluster.endpoint, group, topic) as consumer:
        producer.send_many(topic, [b"a", b"b", b"poison"])
        for message in drain(consumer, 3, ack=False):
            if message.body == b"poison":
                consumer.forward_to_dlq(message)
    assert main(["stats", *brokers(cluster), "-t", topic, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["brokers"] == {"asked": 2, "answered": 2, "failed": {}, "not_asked": [], "missing": [], "cut": []}
    [row] = [g for g in stats["groups"] if g["group"] == group]
    assert (row["topic"], row["inflight"], row["lag"]) == (topic, 2, 2)
    assert {"topic": topic, "messages": 3} in stats["topics"]
    assert main(["dlq", "list", group, *brokers(cluster), "--json"]) == 0
    dead = json.loads(capsys.readouterr().out)
    assert (dead["topic"], dead["stored"], dead["not_resent"]) == (f"%DLQ%{group}", 1, 1)
    assert [(m["origin_topic"], m["body_prefix"]) for m in dead["messages"]] == [(topic, "poison")]
    argv = ["bench", "-e", cluster.endpoint, "-n", "200", "-b", "50", "--samples", "2", "--size", "1KiB", "--json"]
    assert main(argv) == 0
    bench = json.loads(capsys.readouterr().out)
    assert (bench["count"], bench["size"]) == (200, 1024)
    assert [(p["phase"], p["messages"]) for p in bench["phases"]] == [
        ("produce", 200),
        ("consume+ack", 200),
        ("idle wake", 2),
    ]


class _FullStdout:
    """A stdout on a full disk (`> /dev/full`)."""

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("stdout", [None, _FullStdout()])
def test_a_json_error_document_that_cannot_be_written_leaves_the_exit_code_alone(
    stdout: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens (exit 69) and stdout is closed or full: still 69 and one line on stderr, no traceback."""
    monkeypatch.setattr("sys.stdout", stdout)
    assert main(["stats", "-e", "127.0.0.1:1", "--json"]) == NOTHING_LISTENS
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
