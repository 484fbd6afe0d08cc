"""What the commands print: tables or one JSON document on stdout; progress, summaries and errors on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .. import errors
from .._transport import CERT_HINT, PLAINTEXT_HINT, TLS_HINT

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
