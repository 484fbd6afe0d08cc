"""Each `popgate` client command against the shared cluster prints what it says (stats and dlq: test_cli_admin)."""

from __future__ import annotations

import base64
import io
import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate import Producer, SimpleConsumer
from popgate.cli.admin import Broker, fetch_stats, lag_rows
from popgate.cli.cluster import Cluster
from popgate.cli.main import main
from tests.integration.sdk.conftest import drain, eventually
from tests.integration.sdk.popgate_up import POPGATE


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def brokers(cluster: Cluster) -> list[str]:
    return [arg for target in cluster.broker_targets() for arg in ("--broker", target)]


def test_send_from_argument_file_stdin_and_generated_when_asked(
    endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = name("cli")
    assert main(["send", "--endpoint", endpoint, topic, "hello", "--tag", "greeting", "--key", "k1"]) == 0
    printed = capsys.readouterr()
    assert f"sent 1 message (5 B) to {topic}" in printed.err
    message_id = printed.out.strip()  # stdout holds the id alone: `id=$(popgate send t hello)`
    assert len(message_id.split()) == 1
    body = tmp_path / "body.bin"
    body.write_bytes(b"from a file")
    assert main(["send", "--endpoint", endpoint, topic, "--file", str(body)]) == 0
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"from stdin")))
    assert main(["send", "--endpoint", endpoint, topic, "-"]) == 0
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"stdin after the options")))
    assert main(["send", topic, "--endpoint", endpoint, "--tag", "t", "-"]) == 0  # was "unrecognized arguments: -"
    assert main(["send", topic, "--endpoint", endpoint, "--tag", "t", "after the options"]) == 0  # not refused
    with pytest.raises(SystemExit):  # neither sent nor taken silently
        main(["send", topic, "--endpoint", endpoint, "one", "two"])
    assert "popgate send: error: unrecognized arguments: two" in capsys.readouterr().err  # send's usage
    assert main(["send", "--endpoint", endpoint, topic, "body", "--file", str(body)]) == 2
    assert "not both" in capsys.readouterr().err
    started = time.monotonic()
    assert main(["send", "--endpoint", endpoint, topic, "--count", "400", "--random-size", "64", "--rate", "4000"]) == 0
    took = time.monotonic() - started
    out = capsys.readouterr().err
    assert f"sent 400 messages (64 B each) to {topic}" in out
    # --rate is a ceiling on the average: 400 at 4000/s take at least 0.1 s, and the reported rate is at most 4000
    assert took >= 400 / 4000, took
    reported = re.search(r"in ([0-9.]+) s \(([0-9,]+) msg/s\)", out)
    assert reported is not None, out
    assert float(reported[1]) >= 0.1 and int(reported[2].replace(",", "")) <= 4000, out
    with SimpleConsumer(endpoint, name("g"), topic) as consumer:
        got = drain(consumer, 405)
    bodies = [m.body for m in got]
    assert {b"hello", b"from a file", b"from stdin", b"stdin after the options", b"after the options"} <= set(bodies)
    assert sum(len(b) == 64 for b in bodies) == 400
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


def table_rows(out: str) -> dict[str, list[str]]:
    """A rich table's rows by their first cell: the cells, stripped."""
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.count("│") > 3]
    return {cells[0]: cells[1:] for cells in rows}


def test_bench_prints_a_summary_table(endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "--endpoint", endpoint, "--count", "600", "--batch", "100", "--samples", "3", "--concurrency", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "popgate bench via" in out
    rows = table_rows(out)
    produce, consume, idle = rows["produce"], rows["consume+ack"], rows["idle wake"]  # messages seconds msg/s p50 ..
    assert produce[0] == consume[0] == "600"
    # The clock stops at the 600th ack: the other consumers' last (empty, up to 1 s) long polls are not
    # counted (they made it 0.85 s where 0.12 s is right: 4 consumers seemed 4 times slower than 1)
    seconds, rate = float(consume[1]), int(consume[2].replace(",", ""))
    assert seconds < 0.95, consume  # that mistake counts a whole empty long poll (wait=1.0 s); 0.1-0.2 s measured
    assert 600 / (seconds + 0.005) - 1 <= rate <= 600 / max(seconds - 0.005, 1e-3) + 1, consume  # seconds shown rounded
    # idle wake measures latency only: 3 samples, no seconds or rate to show
    assert idle[:3] == ["3", "-", "-"]
    p50, p99, worst = (float(cell) for cell in idle[3:])
    assert 0 < p50 <= p99 <= worst < 1000


def test_bench_on_a_reused_topic_consumes_only_its_own_messages(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each run used to read with a new group, from the topic's first message: the second run consumed the
    first run's messages (and timed their idle wake from their old send times), leaving a group behind per run."""
    topic = name("bench")
    argv = ["bench", "--endpoint", cluster.endpoint, "--topic", topic, "--count", "300", "--samples", "3"]
    for _ in range(2):
        assert main(argv) == 0
    capsys.readouterr()
    brokers = [Broker(*target.split("=")) for target in cluster.broker_targets()]
    rows = lag_rows(fetch_stats(brokers, bpb.StatsRequest(), timeout=5.0))
    ours = {key: (row.lag, row.inflight) for key, row in rows.items() if key[0] in (topic, f"{topic}-idle")}
    assert ours == {(topic, "popgate-bench"): (0, 0), (f"{topic}-idle", "popgate-bench"): (0, 0)}, ours


def test_receive_prints_bodies_exactly(endpoint: str, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    topic, group = name("cli"), name("g")
    binary = os.urandom(300)
    markup = ":smile: [bold]not bold[/bold] :+1:"
    with Producer(endpoint) as producer:
        producer.send(topic, binary)
        producer.send(topic, markup.encode())
    argv = ["receive", "--endpoint", endpoint, topic, "--wait", "3", "--count", "2", "--invisible", "1", "--no-ack"]
    assert main([*argv, "--group", group, "--format", "body"]) == 0
    out = capsysbinary.readouterr().out  # each body as raw bytes, then a newline
    one, two = binary + b"\n", markup.encode() + b"\n"
    assert out in (one + two, two + one), out
    assert main([*argv, "--group", name("g"), "--format", "json"]) == 0
    records = [json.loads(line) for line in capsysbinary.readouterr().out.decode().splitlines()]
    assert sorted(r.get("body", "") for r in records) == ["", markup]
    assert [base64.b64decode(r["body_base64"]) for r in records if "body_base64" in r] == [binary]
    assert main([*argv, "--group", name("g"), "--format", "text"]) == 0
    assert repr(markup) in capsysbinary.readouterr().out.decode()


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["send", "t", "--file", "no-such-file"], "popgate send: [Errno 2] No such file or directory: 'no-such-file'"),
        (["send", "t", "--file", "/"], "popgate send: [Errno 21] Is a directory: '/'"),
        (["send", "t", "x", "--property", "novalue"], "popgate send: --property 'novalue': expected KEY=VALUE"),
    ],
)
def test_bad_input_is_one_line_and_code_2(
    endpoint: str, argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--endpoint", endpoint]) == 2
    assert capsys.readouterr().err.strip() == error


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["send", "t", "x", "--delay", "-5"], "argument --delay: must be 0s..7d, got -5"),
        (["send", "t", "x", "--count", "0"], "argument -n/--count: must be >= 1, got 0"),
        (["send", "t", "x", "--rate", "nan"], "argument --rate: not a finite number: 'nan'"),
        (["receive", "t", "--group", "g", "--batch", "100"], "argument -b/--batch: must be 1..32, got 100"),
        (["receive", "t", "--group", "g", "--invisible", "0"], "argument --invisible: must be > 0s, got 0"),
        (["bench", "--concurrency", "0"], "argument --concurrency: must be >= 1, got 0"),
    ],
)
def test_out_of_range_options_are_usage_errors(argv: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().endswith(f"error: {error}")


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Running:
    """A `popgate` command in a subprocess; its stdout lines as they come (a reader thread)."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen(
            [POPGATE, *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # As from a terminal: SIGINT at its default even when the suite itself ignores it (a shell's background
            # job does, and an ignored signal stays ignored across exec: `make test &` failed both Ctrl-C tests).
            preexec_fn=_sigint_default,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc: object) -> None:
        """Whatever happened in the test: the command is not left running."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def interrupt(self) -> tuple[int, str, str]:
        """Ctrl-C; exit code, the rest of stdout and stderr."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(15)
        finally:
            self.proc.kill()  # a no-op once it exited
            self._reader.join(10)
            err = self.proc.stderr.read()
            self.proc.stdout.close()
            self.proc.stderr.close()
        rest = []
        while not self.lines.empty():
            rest.append(self.lines.get_nowait())
        return code, "".join(rest), err


def test_ctrl_c_during_receive_prints_the_summary(cluster: Cluster) -> None:
    topic, group, endpoint = name("cli"), name("g"), cluster.endpoint
    with Producer(endpoint) as producer:
        producer.send_many(topic, [b"one", b"two"])
    brokers = [Broker(*target.split("=")) for target in cluster.broker_targets()]

    def acked() -> bool | None:  # the broker has both acks (the command may not have counted them yet)
        stats = fetch_stats(brokers, bpb.StatsRequest(topic=topic, group=group), timeout=1.0)
        rows = lag_rows(stats).get((topic, group))
        return True if rows is not None and rows.lag == rows.inflight == 0 else None

    def held() -> list[int]:  # long polls held at each broker; this package's tests run one at a time
        stats = fetch_stats(brokers, bpb.StatsRequest(), timeout=1.0)
        return [s.held_pops + s.held_notifications for s in stats.values()]

    eventually(lambda: True if sum(held()) == 0 else None, timeout=10, what="no long poll held before the command")
    argv = ["--endpoint", endpoint, topic, "--group", group, "--wait", "60", "--format", "json"]
    with Running("receive", *argv) as running:
        bodies = {json.loads(running.lines.get(timeout=20))["body"] for _ in range(2)}  # printed as they come
        assert bodies == {"one", "two"}
        eventually(acked, timeout=10, what="both messages acked")
        # The broker records an ack before the command counts it (it counts once the call returns): its
        # next receive held says it has counted both and is waiting, as a user's Ctrl-C finds it. A quiet
        # group's receive is pop with notify, held at every broker; the Notification the first receive left at
        # the broker that did not answer may not be cancelled yet, so one broker holding one proves nothing.
        eventually(lambda: True if min(held()) > 0 else None, timeout=10, what="the next receive held at every broker")
        code, _, err = running.interrupt()
    assert code == 130 and "Traceback" not in err, err
    assert err.strip() == f"received and acked 2 messages from {topic} (group {group}) (interrupted)"


def test_ctrl_c_during_bench_prints_the_phases_so_far(cluster: Cluster) -> None:
    topic = name("bench")
    argv = ["--endpoint", cluster.endpoint, "--topic", topic, "--count", "10000000", "--concurrency", "1"]
    brokers = [Broker(*target.split("=")) for target in cluster.broker_targets()]

    def second_batch_stored() -> bool | None:  # one call at a time: the first batch's answer is in
        stats = fetch_stats(brokers, bpb.StatsRequest(topic=topic), timeout=1.0)
        return True if sum(q.max_offset for s in stats.values() for q in s.queues if q.topic == topic) > 100 else None

    with Running("bench", *argv, "--batch", "100") as running:
        eventually(second_batch_stored, timeout=20, what="bench producing")
        code, out, err = running.interrupt()
    assert code == 130 and "Traceback" not in err, err
    assert "popgate bench: interrupted during produce" in err
    produce = table_rows(out)["produce"]
    assert 100 <= int(produce[0]) < 10_000_000 and float(produce[1]) > 0, out


def test_ctrl_c_quits_top_at_once_while_the_proxy_does_not_answer() -> None:
    """Through a proxy that accepts and never answers, Ctrl-C does not wait out the Stats call's deadline
    (--timeout and the proxy's 5 s for its brokers)."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent.settimeout(20)
        endpoint = f"127.0.0.1:{silent.getsockname()[1]}"
        with Running("top", "--endpoint", endpoint, "--timeout", "3") as running:
            accepted = [silent.accept()[0] for _ in range(2)]  # the check that it listens, then the Stats call's
            started = time.monotonic()
            code, _, err = running.interrupt()
            elapsed = time.monotonic() - started
        for connection in accepted:
            connection.close()
    assert code == 0 and "Traceback" not in err, err
    assert elapsed < 2, elapsed


def test_ctrl_c_stops_bench_at_once_while_the_proxy_does_not_answer() -> None:
    """Its start-up asks the proxy to create the topics: Ctrl-C does not wait out that call's deadline."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent.settimeout(20)
        with Running("bench", "--endpoint", f"127.0.0.1:{silent.getsockname()[1]}") as running:
            accepted = [silent.accept()[0] for _ in range(3)]  # two checks that it listens, then CreateTopic's
            started = time.monotonic()
            code, _, err = running.interrupt()
            elapsed = time.monotonic() - started
        for connection in accepted:
            connection.close()
    assert code == 130 and "Traceback" not in err and "popgate bench: interrupted during start-up" in err, err
    assert elapsed < 2, elapsed
