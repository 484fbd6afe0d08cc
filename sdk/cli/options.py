"""The options the `popgate` commands share, how their values are read, and the check that a proxy listens.

A short flag means the same in every command that has it: ``-e/--endpoint``, ``-g/--group`` (a consumer group),
``-n/--count``, ``-w/--wait``, ``-b/--batch``, ``-t/--topic``, ``-q/--quiet`` (docs/SDK.md, "The `popgate`
command"). Durations are seconds or carry a unit (``500ms``, ``2m``); sizes are bytes or carry a unit (``4KiB``,
``64MiB``): `popgate_process.config` reads both, for the servers' flags too.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from popgate_contract.errors import DomainError
from popgate_contract.validation import check_group, check_tag, check_topic, parse_host_port
from popgate_process.units import format_duration, format_size, parse_duration, parse_size

from .._durations import MAX_DURATION_S
from .._transport import MAX_MESSAGE_BYTES
from ..client import SimpleConsumer

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Sub = argparse._SubParsersAction

T = TypeVar("T", int, float)

# The SDK's own defaults, so that `popgate receive` waits and batches as a SimpleConsumer does
# (tests/unit/sdk/test_cli_conventions.py).
_SDK = inspect.signature(SimpleConsumer).parameters
SDK_WAIT_S: float = _SDK["wait"].default
SDK_BATCH: int = _SDK["batch"].default
SDK_INVISIBLE_S: float = _SDK["invisible"].default


def _bounded(value: T, text: str, low: T | None, high: T | None, above: T | None, show: Callable[[T], str]) -> T:
    """`value` when within low..high (inclusive) and above `above`; an argparse error in `show`'s units otherwise."""
    if isinstance(value, float) and not math.isfinite(value):  # nan, inf
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    if above is not None and not value > above:
        raise argparse.ArgumentTypeError(f"must be > {show(above)}, got {text}")
    if (low is not None and value < low) or (high is not None and value > high):
        if high is None:
            bounds = f">= {show(low)}"  # type: ignore[arg-type]
        else:
            bounds = f"<= {show(high)}" if low is None else f"{show(low)}..{show(high)}"
        raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
    return value


def number(
    kind: Callable[[str], T], *, low: T | None = None, high: T | None = None, above: T | None = None
) -> Callable[[str], T]:
    """An argparse type: `kind` within low..high (inclusive) or above `above`; argparse reports the rest."""

    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        return _bounded(value, text, low, high, above, str)

    return parse


class Duration:
    """An argparse type: seconds, or a number with a unit (``500ms``, ``2m``, ``1h30m``), within bounds.
    `show` is how --help prints a default of it (``20s``)."""

    def __init__(self, *, low: float | None = 0.0, high: float = MAX_DURATION_S, above: float | None = None) -> None:
        self.low, self.high, self.above = low, high, above

    def __call__(self, text: str) -> float:
        try:
            value = parse_duration(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return _bounded(value, text, self.low, self.high, self.above, format_duration)

    @staticmethod
    def show(value: float) -> str:
        return format_duration(value)


class Size:
    """An argparse type: bytes, or a number with a 1024-based unit (``4KiB``, ``64MiB``), within bounds."""

    def __init__(self, *, low: int, high: int) -> None:
        self.low, self.high = low, high

    def __call__(self, text: str) -> int:
        try:
            value = parse_size(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return _bounded(value, text, self.low, self.high, None, format_size)

    @staticmethod
    def show(value: int) -> str:
        return format_size(value)


def group_name(text: str) -> str:
    """An argparse type: a consumer group name as brokers take it. A bad one is a usage error (exit 2) before any
    call is made — tests/unit/sdk/test_commands.py::test_a_group_command_refuses_a_group_no_broker_takes,
    ::test_usage_mistakes_name_the_commands_own_flags, ::test_bad_names_and_tags_are_usage_errors_in_every_command."""
    return _checked(check_group, text)


def topic_name(text: str) -> str:
    """An argparse type: a topic name as brokers take it (as `group_name`)."""
    return _checked(check_topic, text)


def tag_text(text: str) -> str:
    """An argparse type: a message tag a message may carry (as `group_name`), UTF-8 text."""
    return _checked(check_tag, utf8_text(text))


def utf8_text(text: str) -> str:
    """An argparse type: text an argument carries as it is, refused (exit 2) when it is not UTF-8 (a byte the
    terminal's encoding could not read comes as a surrogate) — tests/unit/sdk/test_commands.py::
    test_arguments_that_are_not_utf8_are_usage_errors_and_a_body_is_sent_as_its_bytes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"{text.encode('utf-8', 'replace')!r} is not UTF-8 text") from None
    return text


def _checked(check: Callable[[str], str], text: str) -> str:
    try:
        return check(text)
    except DomainError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


POSITIVE = number(int, low=1)
NON_NEGATIVE_INT = number(int, low=0)
# Durations as the SDK takes them (at most MAX_DURATION_S, 7 days): a larger value is a usage error, not the SDK's.
DURATION = Duration()
POSITIVE_DURATION = Duration(low=None, above=0.0)
# More could never be sent (the request's envelope counts against the gRPC message limit too): refused before built.
BODY_SIZE = Size(low=1, high=MAX_MESSAGE_BYTES - 64 * 1024)


def client_options(parser: argparse.ArgumentParser) -> None:
    """How a command reaches the proxy: -e/--endpoint, credentials, TLS."""
    env = os.environ.get
    parser.add_argument(
        "-e",
        "--endpoint",
        default=env("POPGATE_ENDPOINT", "127.0.0.1:8081"),
        help="proxy HOST:PORT (env POPGATE_ENDPOINT, else 127.0.0.1:8081)",
    )
    parser.add_argument("--access-key", default=env("POPGATE_ACCESS_KEY"), help="v2 credentials (env too)")
    parser.add_argument("--secret-key", default=env("POPGATE_SECRET_KEY"), help="v2 credentials (env too)")
    parser.add_argument("--tls", action="store_true", help="TLS with the system's root certificates")
    parser.add_argument("--tls-ca", type=Path, help="TLS with these PEM root certificates")


def quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no progress and no summary on stderr (errors are still told)"
    )


def json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout instead of the table")


def connection(args: argparse.Namespace) -> dict[str, Any]:
    tls: bool | Path = args.tls_ca if args.tls_ca else bool(args.tls)
    if (args.access_key is None) != (args.secret_key is None):  # told as the options, not the SDK's arguments
        raise ValueError("give --access-key and --secret-key together (or POPGATE_ACCESS_KEY and POPGATE_SECRET_KEY)")
    return {"access_key": args.access_key, "secret_key": args.secret_key, "tls": tls}


NOTHING_LISTENS = 69  # the exit code when no server listens at --endpoint (sysexits.h: EX_UNAVAILABLE)
PROBE_TIMEOUT_S = 3.0


class NothingListens(Exception):
    """No server at the endpoint: refused, a host that does not resolve, or no answer to a TCP connect."""


def check_listening(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Return once a TCP connection to `endpoint` opens; NothingListens, in one line, otherwise.

    The SDK retries a refused connection for seconds, as a running program should across a proxy restart; a
    command is told at once (tests/integration/sdk/test_cli_conventions.py). Not checked when grpc would go
    through an HTTP proxy (its environment variables), which the direct connection would not test.
    """
    host, port = parse_host_port(endpoint, what="--endpoint")
    if _via_http_proxy(host):
        return
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except socket.gaierror as exc:
        raise NothingListens(f"cannot resolve {host} ({exc.strerror}): check --endpoint") from None
    except ConnectionRefusedError:
        raise NothingListens(
            f"nothing listens at {endpoint} (connection refused): is the proxy running? (--endpoint, POPGATE_ENDPOINT)"
        ) from None
    except TimeoutError:
        raise NothingListens(f"no answer from {endpoint} within {timeout_s:g} s: check --endpoint") from None
    except OSError as exc:  # unreachable network, ...
        raise NothingListens(f"cannot connect to {endpoint}: {exc.strerror or exc}") from None


def _via_http_proxy(host: str) -> bool:
    """Whether grpc would connect to `host` through an HTTP proxy (grpc_proxy, https_proxy or http_proxy set, and
    `host` not excepted by no_grpc_proxy / no_proxy)."""
    env = os.environ.get
    if not (env("grpc_proxy") or env("https_proxy") or env("http_proxy")):
        return False
    excepted = (env("no_grpc_proxy") or env("no_proxy") or "").lower().replace(" ", "").split(",")
    name = host.lower()
    return not any(e == "*" or name == e.lstrip(".") or name.endswith("." + e.lstrip(".")) for e in excepted if e)
