"""Pieces of the `popgate` commands that need no server."""

from __future__ import annotations

import argparse
import io
import os
import re
from pathlib import Path

import grpc
import pytest
from popgate_pb import broker_pb2 as bpb

from popgate import Message, Producer, RetryPolicy, errors
from popgate._transport import convert
from popgate.cli import output, sending
from popgate.cli.commands import IdleWait, OnePass
from popgate.cli.main import main
from popgate.cli.output import error_console, explain


def test_wait_zero_still_polls_once() -> None:
    idle = IdleWait(0.0)
    assert idle.next() == 0.0
    assert idle.next() is None


def test_each_batch_restarts_the_idle_wait() -> None:
    now = [100.0]
    first = IdleWait(5.0, clock=lambda: now[0]).next()
    assert first == 1.0  # one receive waits at most 1 s: Ctrl-C stays prompt
    idle = IdleWait(0.05, clock=lambda: now[0])
    assert idle.next() == pytest.approx(0.05)
    now[0] += 0.06  # the wait has passed ...
    idle.received()  # ... but a batch came: wait on
    assert idle.next() == pytest.approx(0.05)
    now[0] += 0.06
    assert idle.next() is None


def _help(command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """`popgate <command> --help`: each option's entry (its help on one line) by option."""
    monkeypatch.setenv("COLUMNS", "300")  # no wrapping within an entry
    with pytest.raises(SystemExit) as exited:
        main([*command.split(), "--help"])
    assert exited.value.code == 0
    entries = re.findall(
        r"^  (?:-[a-z] [A-Z_]+, |-[a-z], )?(--[a-z-]+)(.*(?:\n {6,}.*)?)", capsys.readouterr().out, re.MULTILINE
    )
    return {option: " ".join(text.split()) for option, text in entries}


def test_help_shows_each_options_default_but_not_a_secret_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POPGATE_SECRET_KEY", "s3cret")
    monkeypatch.setenv("POPGATE_BROKER_TOKEN", "t0ken")
    receive = _help("receive", monkeypatch, capsys)
    for option, default in [("--wait", "20s"), ("--invisible", "30s"), ("--batch", "16"), ("--format", "text")]:
        assert receive[option].endswith(f"(default: {default})"), receive[option]
    send = _help("send", monkeypatch, capsys)
    assert send["--count"].endswith("(default: 1)") and send["--batch"].endswith("(default: 256)"), send
    assert _help("dlq list", monkeypatch, capsys)["--timeout"].endswith("(default: 3s)")
    assert _help("bench", monkeypatch, capsys)["--size"].endswith("(default: 256B)")
    assert "s3cret" not in send["--secret-key"] and "t0ken" not in _help("stats", monkeypatch, capsys)["--broker-token"]
    assert "default" not in receive["--no-ack"] + send["--tag"]  # a flag; an option without a default
    up = _help("up", monkeypatch, capsys)
    assert up["--flush"].startswith("{sync,async} ") and up["--brokers"].endswith("(default: 3)"), up


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


class RpcFailure(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


# What grpc says when a connection attempt times out (its connect timeout, 20 s): the TCP connection was not made
# (the server's backlog full, as at its descriptor limit); made, but no HTTP/2 SETTINGS came; made, but no TLS answer.
TIMED_OUT = [
    "UNKNOWN: ipv4:127.0.0.1:57823: tcp handshaker shutdown",
    "UNKNOWN: ipv4:127.0.0.1:33557: Failed to connect to remote host: connect() timed out",
    "UNKNOWN: ipv4:127.0.0.1:46727: connection attempt timed out before receiving SETTINGS frame",
    "UNAVAILABLE: ipv4:127.0.0.1:56913: Handshake read failed (Endpoint closing)",
]


@pytest.mark.parametrize(
    ("failure", "tls", "hinted"),
    [
        (RpcFailure(UNAVAILABLE, "failed to connect to all addresses; last error: ...: Socket closed"), False, True),
        (RpcFailure(UNAVAILABLE, "failed to connect to all addresses; last error: ...: Socket closed"), True, False),
        (
            RpcFailure(UNAVAILABLE, "failed to connect to all addresses; ...: connect: Connection refused (111)"),
            False,
            False,
        ),
        (RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"), False, False),
        (
            RpcFailure(UNAVAILABLE, "failed to connect to all addresses; ...: recvmsg:Connection reset by peer (104)"),
            False,
            True,
        ),
        *[
            (RpcFailure(UNAVAILABLE, "failed to connect to all addresses; last error: " + d), False, False)
            for d in TIMED_OUT
        ],
        (RpcFailure(UNAVAILABLE, "failed to connect to all addresses; ...: Failed parsing HTTP/2 (...)"), False, False),
    ],
)
def test_only_a_failed_plaintext_connection_gets_the_tls_hint_named_in_the_commands_options(
    failure: RpcFailure, tls: bool, hinted: bool
) -> None:
    error = convert(failure, tls=tls)
    assert ("is the server using TLS? connect with tls=True" in str(error)) is hinted
    assert ("try --tls / --tls-ca" in explain(error)) is hinted
    assert "tls=True" not in explain(error)


@pytest.mark.parametrize("details", TIMED_OUT)
@pytest.mark.parametrize("tls", [False, True])
def test_a_connection_attempt_that_timed_out_says_the_server_did_not_answer_in_time(details: str, tls: bool) -> None:
    """A plaintext proxy out of descriptors, overloaded or stopped is not said to want TLS."""
    error = convert(RpcFailure(UNAVAILABLE, "failed to connect to all addresses; last error: " + details), tls=tls)
    assert isinstance(error, errors.Unavailable) and error.retriable
    assert "did not answer in time" in str(error) and "TLS" not in explain(error).replace(details, "")


def test_a_look_without_acks_ends_at_the_first_message_shown_already() -> None:
    look = OnePass()
    first = [Message(b"x", message_id=f"m{i}") for i in range(3)]
    assert look.new(first) == first and not look.over
    # m0 came round again (its invisible time passed): m3, new, is still shown; then the pass is over
    again = [first[0], Message(b"y", message_id="m3")]
    assert [m.message_id for m in look.new(again)] == ["m3"] and look.over


@pytest.mark.parametrize("argv", [["stats", "--broker", "no-equals-sign"], ["stats"]])
def test_a_bad_or_missing_broker_is_bad_input(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("popgate stats: ") and err.count("\n") == 1


def test_an_error_stays_one_line_when_stderr_is_not_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    error_console().print("popgate send: " + "the proxy at 127.0.0.1:1 is unreachable " * 8)
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["send", "t", "x", "--rate", "inf"],
        ["send", "t", "x", "--rate", "1e-300"],  # a sleep past what the clock can represent
        ["send", "t", "x", "--delay", "nan"],
        ["receive", "t", "--group", "g", "--invisible", "inf"],
    ],
)
def test_non_finite_or_absurd_durations_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--endpoint", "127.0.0.1:1"])
    assert exited.value.code == 2 and "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["send", "t", "x", "--delay", "1e20"], "argument --delay: must be 0s..7d, got 1e20"),
        (["receive", "t", "--group", "g", "--wait", "1e10"], "argument -w/--wait: must be 0s..7d, got 1e10"),
        (["receive", "t", "--group", "g", "--wait", "8d"], "argument -w/--wait: must be 0s..7d, got 8d"),
        (["receive", "t", "--group", "g", "--invisible", "1e20"], "argument --invisible: must be <= 7d, got 1e20"),
        (["dlq", "list", "g", "--broker", "b1=127.0.0.1:1", "--timeout", "1e10"], "argument --timeout: must be <= 7d"),
    ],
)
def test_durations_longer_than_the_sdk_sends_are_usage_errors(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--endpoint", "127.0.0.1:1"])
    assert exited.value.code == 2 and f"error: {error}" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "option"), [(["send", "t"], "--random-size"), (["bench"], "--size")])
@pytest.mark.parametrize("size", [str(64 * 1024 * 1024 + 1), "1TiB"])
def test_a_body_size_over_the_grpc_message_limit_is_a_usage_error(
    command: list[str], option: str, size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:  # not a 1 TB body built in memory first
        main([*command, option, size, "--endpoint", "127.0.0.1:1"])
    assert exited.value.code == 2
    assert f"argument {option}: must be " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "advice"),
    [
        # 100 bodies of 60 MiB per call; `send` has no --concurrency to lower
        (["send", "t", "--random-size", "60MiB", "--count", "100"], "lower --random-size or --batch\n"),
        (["bench", "--size", "4MiB"], "lower --size, --batch or --concurrency\n"),  # 8 x 256 x 4 MiB
    ],
)
def test_more_bodies_at_once_than_fit_in_memory_are_bad_input(
    argv: list[str], advice: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--endpoint", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"GiB in memory: {advice}") and err.count("\n") == 1


def test_a_body_from_a_file_too_large_for_its_batch_names_only_the_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = tmp_path / "body"
    body.write_bytes(b"x" * (16 * 1024 * 1024))
    assert main(["send", "t", "--file", str(body), "--count", "100", "--endpoint", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.endswith("GiB in memory: lower --batch\n")


class _Stdin(io.RawIOBase):
    """A stdin of `size` zero bytes (`head -c 80M /dev/zero | popgate send t -`); counts the bytes read from it."""

    def __init__(self, size: int) -> None:
        self.size, self.read_bytes = size, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.size - self.read_bytes)
        buffer[:n] = bytes(n)
        self.read_bytes += n
        return n


def test_a_body_from_stdin_larger_than_a_body_can_be_is_bad_input_read_no_further(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = _Stdin(80 * 1024 * 1024)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BufferedReader(stdin)))
    assert main(["send", "t", "-", "--endpoint", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err == "popgate send: stdin is larger than a message body can be (65472KiB)\n"
    assert stdin.read_bytes <= 64 * 1024 * 1024  # the limit and a byte, not the whole input


def test_a_body_file_larger_than_a_body_can_be_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = tmp_path / "body"
    with body.open("wb") as sparse:
        sparse.truncate(65 * 1024 * 1024)
    assert main(["send", "t", "--file", str(body), "--endpoint", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err == f"popgate send: {body} is larger than a message body can be (65472KiB)\n"


def test_a_retry_policy_without_back_off_is_refused() -> None:
    with pytest.raises(ValueError, match="initial_backoff"):
        RetryPolicy(initial_backoff=0)  # iteration would retry in a busy loop


class _Pipe(io.TextIOBase):
    """A stdout whose reader goes away after `room` lines: the write that brings more fails with EPIPE.
    `fd`: what fileno() gives (a real pipe's end, or a regular file's)."""

    def __init__(self, room: int, events: list[str], fd: int) -> None:
        self.room, self.events, self.fd = room, events, fd

    def fileno(self) -> int:
        return self.fd

    def write(self, text: str) -> int:
        if text.count("\n") > self.room:
            raise BrokenPipeError(32, "Broken pipe")
        self.room -= text.count("\n")
        self.events += [f"out {line.split()[0]}" for line in text.splitlines()]
        return len(text)

    def flush(self) -> None:
        self.events.append("flush")


class _Consumer:
    def __init__(self, batch: list[Message], events: list[str]) -> None:
        self.batch, self.events = batch, events

    def __enter__(self) -> _Consumer:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def close(self) -> None:
        pass

    def receive(self, *, max: int, wait: float) -> list[Message]:
        batch, self.batch = self.batch[:max], self.batch[max:]
        return batch

    def ack(self, message: Message) -> None:
        self.events.append(f"ack {message.message_id}")

    def ack_many(self, messages: list[Message]) -> None:
        self.events.append("ack " + ",".join(m.message_id for m in messages))


def _receive_into(stdout: _Pipe, events: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    batch = [Message(b"x", message_id=f"m{i}", topic="t") for i in range(10)]
    monkeypatch.setattr("popgate.cli.commands.SimpleConsumer", lambda *_, **__: _Consumer(batch, events))
    monkeypatch.setattr("popgate.cli.commands.check_listening", lambda endpoint: None)  # no socket here
    monkeypatch.setattr("sys.stdout", stdout)
    return main(["receive", "t", "--group", "g", "--endpoint", "127.0.0.1:1", "--count", "10", "--wait", "0"])


def test_into_a_pipe_receive_acks_each_message_once_written_and_stops_when_the_reader_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`popgate receive | head -2`: the reader is gone after two lines; the other eight are not acked."""
    events: list[str] = []
    read_end, write_end = os.pipe()
    try:
        assert _receive_into(_Pipe(2, events, write_end), events, monkeypatch) == 141
    finally:
        os.close(read_end)
        os.close(write_end)
    assert events == ["out m0", "flush", "ack m0", "out m1", "flush", "ack m1"]


def test_into_a_file_receive_acks_a_batch_once_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    events: list[str] = []
    with (tmp_path / "out").open("w") as file:
        assert _receive_into(_Pipe(10, events, file.fileno()), events, monkeypatch) == 0
    ids = [f"m{i}" for i in range(10)]
    assert events == [f"out {i}" for i in ids] + ["flush", "ack " + ",".join(ids)]  # one flush, then one ack


def test_a_server_that_is_not_grpc_is_said_to_be_so_not_to_want_tls() -> None:
    failure = RpcFailure(
        UNAVAILABLE, "failed to connect to all addresses; ...: Failed parsing HTTP/2 (got frame type 79)"
    )
    assert "does not speak gRPC" in str(convert(failure, tls=False))


def test_a_server_certificate_that_does_not_verify_is_not_retried() -> None:
    failure = RpcFailure(
        UNAVAILABLE, "failed to connect to all addresses; ...: Ssl handshake failed: CERTIFICATE_VERIFY_FAILED"
    )
    error = convert(failure, tls=True)
    assert not error.retriable and "tls=<the CA certificate file" in str(error)
    other_name = RpcFailure(UNAVAILABLE, "failed to connect to all addresses; ...: Hostname Verification Check failed.")
    assert not convert(other_name, tls=True).retriable


@pytest.mark.parametrize(
    ("endpoint", "said"),
    [
        ("127.0.0.1:73617", "a port is 1..65535"),  # 8081 + 65536: it reached the proxy on 8081
        ("127.0.0.1:70000", "a port is 1..65535"),
        ("http://127.0.0.1:8081", "no scheme: drop http://"),
        ("localhost", "is not HOST:PORT"),
        # the official clients' list syntax, a port 0 and a stray space failed only after 4 s of retries
        ("127.0.0.1:8081;127.0.0.1:8082", "one proxy address HOST:PORT"),
        ("127.0.0.1:0", "a port is 1..65535"),
        (" 127.0.0.1:8081", "no spaces"),
    ],
)
def test_an_endpoint_that_is_no_address_is_refused_before_any_call(endpoint: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        Producer(endpoint)


@pytest.mark.parametrize(
    ("details", "hint"),
    [
        ("...: CERTIFICATE_VERIFY_FAILED: self signed certificate", "pass --tls-ca <the CA certificate file"),
        ("...: WRONG_VERSION_NUMBER: Invalid certificate verification context", "does not use TLS: drop --tls"),
    ],
)
def test_tls_failures_are_not_retried_and_their_hints_name_the_commands_options(details: str, hint: str) -> None:
    """A CLI user was told the SDK's `tls=<...>`, and a TLS client at a plaintext proxy got no hint (and 8 retries)."""
    error = convert(RpcFailure(UNAVAILABLE, "failed to connect to all addresses; last error: " + details), tls=True)
    assert not error.retriable and hint in explain(error) and "tls=" not in explain(error)


def test_usage_mistakes_name_the_commands_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO message with a delay was refused in the SDK's words (message_group, deliver_at); a bad group name
    made `dlq list` show an empty table and exit 0 (and `dlq resend` answer the server's ILLEGAL_TOPIC)."""
    assert main(["send", "t", "x", "--delay", "5", "--message-group", "fifo-1", "--endpoint", "127.0.0.1:1"]) == 2
    assert "--message-group (a FIFO message group) and --delay cannot be used together" in capsys.readouterr().err
    for command in (["dlq", "list", "--broker", "b1=127.0.0.1:1", "bad group"], ["dlq", "resend", "bad group"]):
        with pytest.raises(SystemExit) as exit_:
            main(command)
        assert exit_.value.code == 2
        assert "consumer group" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["consumers"], ["reset", "-t", "t", "--earliest", "--yes"], ["delete", "--yes"]])
@pytest.mark.parametrize("group", ["", "bad group"])
def test_a_group_command_refuses_a_group_no_broker_takes(
    command: list[str], group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`group consumers ''` listed every group's consumers as those of ''."""
    with pytest.raises(SystemExit) as exit_:
        main(["group", command[0], group, *command[1:], "--endpoint", "127.0.0.1:1"])
    assert exit_.value.code == 2 and "error: argument group: consumer group name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["receive", "t", "-g", "bad group!"], "argument -g/--group: consumer group name"),
        (["receive", "bad topic!", "-g", "g"], "argument topic: topic name"),
        (["send", "bad topic!", "x"], "argument topic: topic name"),
        (["send", "t", "x", "--tag", "a||b"], "argument --tag: message tag"),
        (["recall", "bad topic!", "h"], "argument topic: topic name"),
        (["topic", "create", "bad name", "--yes"], "argument topic: topic name"),
        (["topic", "delete", "bad name", "--yes"], "argument topic: topic name"),
        (["lookup", "bad name", "--key", "k"], "argument topic: topic name"),
        (["group", "reset", "g", "-t", "bad name", "--latest", "--yes"], "argument -t/--topic: topic name"),
    ],
)
def test_bad_names_and_tags_are_usage_errors_in_every_command(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A name or tag no broker takes is argparse's usage error (exit 2) before anything is sent, as docs/SDK.md
    says of every option, not the server's refusal (exit 1) after a call."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--endpoint", "127.0.0.1:1"])
    assert exit_.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize(
    ("stream", "argv"),
    [("stdin", ["send", "t", "-"]), ("stdin", ["send", "t", "--file", "-"]), ("stdout", ["receive", "t", "-g", "g"])],
)
def test_a_closed_stdin_or_stdout_is_bad_input_said_in_one_line(
    stream: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`popgate send t - <&-` and `popgate receive t -g g >&-` (Python's sys.stdin/stdout are None): before
    anything is received, not a traceback after."""
    monkeypatch.setattr(f"sys.{stream}", None)
    assert main([*argv, "--endpoint", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err == f"popgate {argv[0]}: {stream} is closed\n"


class _WritesAtClose:
    """A client whose close writes a line to fd 2 itself, as grpc core logs one; closed once, as the SDK's."""

    closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.write(2, b"E grpc core's own line\n")


@pytest.mark.parametrize("operator_set", [None, "ERROR"])
def test_a_client_closed_after_ctrl_c_keeps_grpcs_own_lines_off_stderr_unless_asked(
    operator_set: str | None, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "OPERATOR_GRPC_VERBOSITY", operator_set)
    with pytest.raises(KeyboardInterrupt), output.closed_at_end(_WritesAtClose()):
        raise KeyboardInterrupt
    os.write(2, b"the summary\n")  # fd 2 is back
    lines = capfd.readouterr().err.splitlines()
    assert lines == (["the summary"] if operator_set is None else ["E grpc core's own line", "the summary"])


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["send", "t", "x", "--key", "k\udcff"], "argument --key: b'k?' is not UTF-8 text"),
        (["send", "t", "x", "--property", "a=\udcff"], "argument --property: b'a=?' is not UTF-8 text"),
        (["send", "t", "x", "--message-group", "\udcff"], "argument --message-group: b'?' is not UTF-8 text"),
        (["receive", "t", "-g", "g", "--filter", "\udcff"], "argument --filter: b'?' is not UTF-8 text"),
        (["receive", "t\udcff", "-g", "g"], "argument topic: topic name"),
        (["send", "t", "x", "--tag", "a\udcffb"], "argument --tag: b'a?b' is not UTF-8 text"),
        (["lookup", "t", "--key", "\udcff"], "argument --key: b'?' is not UTF-8 text"),
        (["recall", "t", "\udcff"], "argument HANDLE: b'?' is not UTF-8 text"),
    ],
)
def test_arguments_that_are_not_utf8_are_usage_errors_and_a_body_is_sent_as_its_bytes(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte the terminal's UTF-8 could not read (`$'\\xff'`) comes as a surrogate: in a key, property, message
    group or filter it is a usage error naming the argument, not a codec error; a body argument is its bytes."""
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--endpoint", "127.0.0.1:1"])
    assert exit_.value.code == 2 and said in capsys.readouterr().err
    args = argparse.Namespace(body="\udcff\udcfe bin", file=None, random_size=None)
    assert sending._body(args) == b"\xff\xfe bin"


def test_json_answers_carry_every_field_and_numbers_as_numbers() -> None:
    """`group reset --json` printed queue 0 without `queueId` and offsets as strings."""
    answer = bpb.ResetOffsetResponse(broker="b1", queues=[bpb.QueueReset(queue_id=0, offset=122)])
    assert output.as_json(answer)["queues"] == [{"queueId": 0, "offset": 122, "droppedInflight": 0}]
