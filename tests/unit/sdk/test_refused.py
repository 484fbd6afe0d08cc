"""Arguments the SDK refuses up front with a ValueError naming them, before any call (no server)."""

from __future__ import annotations

import asyncio
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from popgate import Message, Producer, RetryPolicy, SimpleConsumer, _durations, _wire, aio
from popgate.cli.main import main

NOWHERE = "127.0.0.1:1"  # nothing listens: a refused argument must fail before any call is tried
TOO_LONG = [_durations.MAX_DURATION_S + 1, 1e10, 1e20]  # 1e10 s overflows a gRPC deadline; 1e20 no protobuf can carry


def received() -> Message:
    return Message(b"x", topic="t", message_id="m", receipt_handle="h")


@pytest.mark.parametrize("seconds", TOO_LONG)
@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("request_timeout", lambda s: Producer(NOWHERE, request_timeout=s)),
        ("request_timeout", lambda s: aio.SimpleConsumer(NOWHERE, "g", "t", request_timeout=s)),
        ("wait", lambda s: SimpleConsumer(NOWHERE, "g", "t", wait=s)),
        ("invisible", lambda s: SimpleConsumer(NOWHERE, "g", "t", invisible=s)),
        ("wait", lambda s: SimpleConsumer(NOWHERE, "g", "t").receive(wait=s)),
        ("invisible", lambda s: SimpleConsumer(NOWHERE, "g", "t").receive(invisible=s)),
        ("delay", lambda s: SimpleConsumer(NOWHERE, "g", "t").nack(received(), s)),
        ("delay", lambda s: Producer(NOWHERE).send("t", b"x", delay=s)),
        ("deliver_at", lambda s: Producer(NOWHERE).send("t", b"x", deliver_at=s + 2e9)),  # epoch seconds
        ("deliver_at", lambda s: Producer(NOWHERE).send_many("t", [Message(b"x", deliver_at=s + 2e9)])),
        ("wait", lambda s: asyncio.run(aio.SimpleConsumer(NOWHERE, "g", "t").receive(wait=s))),
        ("delay", lambda s: asyncio.run(aio.Producer(NOWHERE).send("t", b"x", delay=s))),
    ],
)
def test_a_duration_too_long_to_send_is_refused_naming_the_argument(
    name: str, call: Callable[[float], Any], seconds: float
) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be .*7 days"):
        call(seconds)


def test_the_longest_durations_are_accepted() -> None:
    longest = _durations.MAX_DURATION_S
    consumer = SimpleConsumer(NOWHERE, "g", "t", wait=longest, invisible=longest, request_timeout=longest)
    request, timeout = consumer._receive_plan(None, None, None)
    assert request.long_polling_timeout.seconds == request.invisible_duration.seconds == int(longest)
    assert timeout == 2 * longest  # the gRPC timeout, far below what overflows a gRPC deadline (~1e10 s)
    later = _wire.outgoing(b"x", delay=longest, now=1000.0)
    assert later.deliver_at == 1000.0 + longest
    assert _wire.change_invisible_request("g", received(), longest).invisible_duration.seconds == int(longest)
    consumer.close()


@pytest.mark.parametrize("content", [b"", b"127.0.0.1 localhost\n", b"-----BEGIN PRIVATE KEY-----\nMIIE\n"])
def test_a_tls_file_without_a_pem_certificate_is_refused_at_construction(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "roots.pem"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"tls={path}: no PEM certificate"):  # not 4 s of retried handshakes
        Producer(NOWHERE, tls=path)
    with pytest.raises(ValueError, match=f"tls={path}"):
        aio.SimpleConsumer(NOWHERE, "g", "t", tls=str(path))


@pytest.mark.parametrize("tls", ["", " "])
def test_an_empty_tls_file_name_is_refused_naming_the_option(tls: str) -> None:
    """Not a read of the working directory (IsADirectoryError), nor plaintext as bool("") would say."""
    with pytest.raises(ValueError, match=f"tls={tls!r}: give a CA certificate file, or True"):
        Producer(NOWHERE, tls=tls)


@pytest.mark.parametrize("namespace", ["tenänt", "bad ns", "a%b", "n" * 65])
def test_a_namespace_the_proxy_would_refuse_is_refused_naming_it(namespace: str) -> None:
    """Not grpc's "Invalid metadata" (an INTERNAL server error) at the first call for one that is no header value."""
    with pytest.raises(ValueError, match="namespace"):
        Producer(NOWHERE, namespace=namespace)


def test_a_bad_tls_ca_is_one_line_and_code_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "hostname"
    path.write_text("not a certificate\n")
    assert main(["send", "t", "x", "--tls-ca", str(path), "--endpoint", NOWHERE]) == 2
    assert (
        capsys.readouterr().err == f"popgate send: tls={path}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it\n"
    )


@pytest.mark.parametrize(
    ("options", "error", "named"),
    [
        ({"properties": {"k": 1}}, TypeError, "properties"),
        ({"properties": {1: "v"}}, TypeError, "properties"),
        ({"priority": 2**31}, ValueError, "priority"),
        ({"priority": -1}, ValueError, "priority"),
        ({"priority": True}, TypeError, "priority"),
        ({"priority": 1.5}, TypeError, "priority"),
    ],
)
def test_a_bad_property_or_priority_is_refused_naming_the_argument(
    options: dict[str, Any], error: type[Exception], named: str
) -> None:
    with Producer(NOWHERE) as producer:
        with pytest.raises(error, match=named):
            producer.send("t", b"x", **options)
        with pytest.raises(error, match=named):
            producer.send_many("t", [Message(b"x", **options)])
    assert _wire.outgoing(b"x", properties={"k": "v"}, priority=2**31 - 1).priority == 2**31 - 1


def consumer(**options: Any) -> SimpleConsumer:
    return SimpleConsumer(NOWHERE, "g", "t", **options)


def bad(value: object) -> Any:
    """An argument of the wrong type, as a caller without a type checker passes it."""
    return value


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("batch", lambda: consumer(batch=1.5)),
        ("batch", lambda: consumer(batch="8")),
        ("batch", lambda: consumer(batch=True)),
        ("invisible", lambda: consumer(invisible="30")),
        ("wait", lambda: aio.SimpleConsumer(NOWHERE, "g", "t", wait=bad("1"))),
        ("request_timeout", lambda: consumer(request_timeout="3")),
        ("max", lambda: consumer().receive(max=bad(1.5))),
        ("max", lambda: consumer().receive(max=bad("3"))),
        ("max", lambda: consumer().receive(max=True)),
        ("wait", lambda: consumer().receive(wait=bad("1"))),
        ("invisible", lambda: consumer().receive(invisible=bad("30"))),
        ("delay", lambda: consumer().nack(received(), bad("5"))),
        ("max", lambda: asyncio.run(aio.SimpleConsumer(NOWHERE, "g", "t").receive(max=bad("3")))),
        ("delay", lambda: asyncio.run(aio.SimpleConsumer(NOWHERE, "g", "t").nack(received(), bad("5")))),
        ("delay", lambda: Producer(NOWHERE).send("t", b"x", delay=bad("5"))),
        ("deliver_at", lambda: Producer(NOWHERE).send("t", b"x", deliver_at=bad("x"))),
        ("max_attempts", lambda: RetryPolicy(max_attempts=bad("3"))),
        ("initial_backoff", lambda: RetryPolicy(initial_backoff=bad("x"))),
        ("max_backoff", lambda: RetryPolicy(max_backoff=bad(None))),
        ("multiplier", lambda: RetryPolicy(multiplier=bad("2"))),
        ("jitter", lambda: RetryPolicy(jitter=True)),
    ],
)
def test_an_argument_of_the_wrong_type_is_refused_naming_it(name: str, call: Callable[[], Any]) -> None:
    """A TypeError naming the argument, before any call; not an unnamed comparison or protobuf error at each receive."""
    with pytest.raises(TypeError, match=rf"^{name} must be "):
        call()


class Count:
    """An integer of another library (as numpy's int64): an `numbers.Integral`, not an `int`."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __index__(self) -> int:
        return self.n

    def __int__(self) -> int:
        return self.n


numbers.Integral.register(Count)


def test_an_integer_of_another_library_is_taken_as_an_int() -> None:
    assert consumer(batch=bad(Count(8))).batch == 8
    request = _wire.receive_request("g", _wire.Subscription("t"), max=bad(Count(16)), invisible=30, wait=1)
    assert request.batch_size == 16


@pytest.mark.parametrize(
    ("error", "name", "call"),
    [
        (TypeError, "topic", lambda: Producer(NOWHERE).send(bad(None), b"x")),
        (TypeError, "topic", lambda: Producer(NOWHERE).send(bad(b"abc"), b"x")),
        (ValueError, "topic", lambda: Producer(NOWHERE).send("t\udc80", b"x")),
        (TypeError, "tag", lambda: Producer(NOWHERE).send("t", b"x", tag=bad(5))),
        (ValueError, "tag", lambda: Producer(NOWHERE).send("t", b"x", tag="a\udc80")),
        (TypeError, "keys", lambda: Producer(NOWHERE).send("t", b"x", keys=[bad(1)])),
        (TypeError, "message_group", lambda: Producer(NOWHERE).send("t", b"x", message_group=bad(5))),
        (ValueError, "properties", lambda: Producer(NOWHERE).send("t", b"x", properties={"k": "\udc80"})),
        (TypeError, "group", lambda: SimpleConsumer(NOWHERE, bad(7), "t")),
        (ValueError, "group", lambda: SimpleConsumer(NOWHERE, "g\udc80", "t")),
        (TypeError, "subscriptions", lambda: SimpleConsumer(NOWHERE, "g", bad(b"abc"))),
        (TypeError, "filter", lambda: SimpleConsumer(NOWHERE, "g", {"t": bad(5)})),
        (ValueError, "topic", lambda: SimpleConsumer(NOWHERE, "g", {"": "*"})),
        (ValueError, "topic", lambda: SimpleConsumer(NOWHERE, "g", ["t", ""])),
    ],
)
def test_names_and_texts_of_the_wrong_type_or_not_utf8_are_refused_naming_them(
    error: type[Exception], name: str, call: Callable[[], Any]
) -> None:
    """Before anything is sent: not protobuf's TypeError naming nothing, a bare UnicodeEncodeError, a bytes topic
    taken as is, or an empty topic refused only at the first receive."""
    with pytest.raises(error, match=rf"^{name} must "):
        call()


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("only a received Message can be acked", lambda: consumer().ack(bad(None))),
        ("only a received Message can be acked", lambda: consumer().ack_many([bad("handle")])),
        ("only a received Message can be nacked", lambda: consumer().nack(bad(None))),
        (
            "only a received Message can be acked",
            lambda: asyncio.run(aio.SimpleConsumer(NOWHERE, "g", "t").ack(bad(7))),
        ),
        ("retry must be a RetryPolicy", lambda: Producer(NOWHERE, retry=bad(3))),
        ("properties map str to str", lambda: Producer(NOWHERE).send("t", Message(b"x", properties=bad([1])))),
    ],
)
def test_a_message_policy_or_properties_of_the_wrong_type_is_a_type_error_saying_so(
    name: str, call: Callable[[], Any]
) -> None:
    with pytest.raises(TypeError, match=rf"^{name}"):
        call()


def test_properties_as_pairs_are_taken_by_a_message_as_by_send() -> None:
    assert _wire.outgoing(Message(b"x", properties=bad([("a", "b")]))).properties == {"a": "b"}
