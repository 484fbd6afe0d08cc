"""What the commands print: tables or one JSON document on stdout; progress, summaries and errors on stderr."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any, Protocol

from google.protobuf import json_format
from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .. import errors
from .._transport import CERT_HINT, PLAINTEXT_HINT, TLS_HINT
from . import OPERATOR_GRPC_VERBOSITY


class Closable(Protocol):
    def close(self) -> None: ...


# The SDK's hints name its arguments; a command's user is told its options.
_CLI_HINTS = {
    TLS_HINT: " (is the server using TLS? try --tls / --tls-ca)",
    CERT_HINT: " (the server's certificate does not verify: pass --tls-ca <the CA certificate file that signed it>)",
    PLAINTEXT_HINT: " (the server does not use TLS: drop --tls / --tls-ca)",
}


# Brokers create topics on first send only with --auto-create (popgate up's dev mode): a user told TOPIC_NOT_FOUND
# is told how to make the topic, or that the name may be misspelled.
TOPIC_HINT = " (brokers create topics on first send only with --auto-create: `popgate topic create NAME`, or a typo?)"


def explain(exc: errors.PopgateError) -> str:
    """The error for the user, the SDK's hints naming the command's options."""
    text = str(exc)
    for sdk_hint, cli_hint in _CLI_HINTS.items():
        text = text.replace(sdk_hint, cli_hint)
    if isinstance(exc, errors.NotFound) and ("does not exist on broker" in text or "exists on none of" in text):
        text += TOPIC_HINT
    return text


@contextlib.contextmanager
def closed_at_end(client: Closable) -> Iterator[None]:
    """`client` closed when the block ends. After Ctrl-C it is closed with grpc core's own lines dropped: grpc
    writes them to fd 2 itself, and one (an epoll error of its poller as the interrupted channel closes, on some
    runs) gets past GRPC_VERBOSITY=NONE, ahead of the command's summary —
    tests/integration/sdk/test_cli.py::test_ctrl_c_during_receive_prints_the_summary. Not when the operator set
    GRPC_VERBOSITY: then grpc's lines are wanted."""
    try:
        yield
    except KeyboardInterrupt:
        with contextlib.nullcontext() if OPERATOR_GRPC_VERBOSITY else _fd2_dropped():
            client.close()
        raise
    finally:
        client.close()  # once: a second close does nothing


@contextlib.contextmanager
def _fd2_dropped() -> Iterator[None]:
    """fd 2 points at /dev/null while the block runs (what Python itself wrote to stderr before is flushed)."""
    sys.stderr.flush()
    try:
        kept = os.dup(2)
    except OSError:  # no stderr at all: nothing to keep clean
        yield
        return
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(kept, 2)
        os.close(kept)


def error_console() -> Console:
    """stderr for the commands: plain text, never wrapped (an error is one line, also in a pipe or a log)."""
    return Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)


def progress(console: Console, *, quiet: bool = False, redirect_stdout: bool = True) -> Progress:
    """A progress display on `console` (stderr), as rich shows it: only in a terminal, and never when `quiet`.
    A task's total may be None (until idle): it then shows the count so far. `redirect_stdout=False` for a
    command that writes stdout itself (bytes, no rich), which then passes quiet when stdout is the terminal."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        redirect_stdout=redirect_stdout,
        disable=quiet or not console.is_terminal,
    )


def stdout_is_a_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def msg_rate(count: int, seconds: float) -> str:
    return f"{count / max(seconds, 1e-9):,.0f} msg/s"


def print_json(document: Any) -> None:
    """`document` as one JSON document on stdout (`--json`): `json.loads` of the whole output gives it back."""
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def as_json(message: Any) -> dict[str, Any]:
    """A protobuf answer as --json prints it: fields without presence with their zeros too (a field a message may
    lack, as its tag, stays out), 64-bit numbers as JSON numbers up to 2^53 (a script reads `queueId` of queue 0 and
    compares offsets as numbers) —
    tests/unit/sdk/test_commands.py::test_json_answers_carry_every_field_and_numbers_as_numbers."""
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True, unquote_int64_if_possible=True)


def json_error(json_asked: bool, line: str) -> None:
    """With --json (`json_asked`), `{"error": line}` on stdout: a command that got no answer still prints one JSON
    document, the line on stderr too —
    tests/integration/sdk/test_cli_admin.py::test_json_is_one_document_with_the_error_when_nothing_answered.
    A stdout that is closed or cannot be written (the failure being reported may be that) is left alone: the line on
    stderr and the command's exit code say it — tests/integration/sdk/test_cli_conventions.py::
    test_a_json_error_document_that_cannot_be_written_leaves_the_exit_code_alone."""
    if json_asked and sys.stdout is not None:
        with contextlib.suppress(OSError, ValueError):  # ValueError: a closed file object
            print_json({"error": line})


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def terminal_text(text: str) -> str:
    """`text` with its control characters (C0, DEL, C1) shown as ``\\xNN``, as `popgate receive` shows a body: what
    a message carries never reaches the terminal as an escape sequence —
    tests/integration/sdk/test_cli_admin.py::test_dlq_list_shows_a_bodys_control_characters_escaped."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)


def print_table(table: Table) -> None:
    """A rich table on stdout, cells as given (no markup or emoji codes).

    In a terminal it fits the window: name columns (`overflow="fold"`) fold onto more lines, every character
    shown, so that number columns (`no_wrap=True`) stay whole. Into a pipe or file it is as wide as its widest
    row, so every id, topic and group stays whole on its line (rich would otherwise assume
    80 columns).
    """
    console = _Stdout(highlight=False, markup=False, emoji=False)
    if not console.is_terminal:
        needed = Measurement.get(console, console.options.update_width(100_000), table).maximum
        console = _Stdout(highlight=False, markup=False, emoji=False, width=max(needed, 80))
    console.print(table)


class _Stdout(Console):
    """A console whose reader going away (`popgate stats | head -1`) is a BrokenPipeError, which `popgate` exits
    141 for as every command does; rich exits 1 itself, the code `stats` keeps for "no broker answered"."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def plural(n: int, word: str = "message") -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"
