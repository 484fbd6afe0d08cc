"""`popgate send` and `popgate receive`, plus the options every client command shares."""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from .. import errors
from .._transport import CERT_HINT, MAX_MESSAGE_BYTES, PLAINTEXT_HINT, TLS_HINT
from .._wire import MAX_DURATION_S
from ..client import Producer, SimpleConsumer
from ..message import Message

if TYPE_CHECKING:
    Sub = argparse._SubParsersAction[argparse.ArgumentParser]
else:
    Sub = argparse._SubParsersAction

T = TypeVar("T", int, float)


def number(
    kind: Callable[[str], T], *, low: T | None = None, high: T | None = None, above: T | None = None
) -> Callable[[str], T]:
    """An argparse type: `kind` within low..high (inclusive) or above `above`; argparse reports the rest."""

    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):  # nan, inf
            raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
        if above is not None and not value > above:
            raise argparse.ArgumentTypeError(f"must be > {above}, got {text}")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"<= {high}" if low is None else f"{low}..{high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value

    return parse


POSITIVE = number(int, low=1)
NON_NEGATIVE_INT = number(int, low=0)
# Durations as the SDK takes them (at most MAX_DURATION_S, 7 days): a larger value is a usage error, not the SDK's.
DURATION = number(float, low=0.0, high=MAX_DURATION_S)
POSITIVE_DURATION = number(float, above=0.0, high=MAX_DURATION_S)
# More could never be sent (the request's envelope counts against the gRPC message limit too): refused before built.
BODY_SIZE = number(int, low=1, high=MAX_MESSAGE_BYTES - 64 * 1024)


IN_MEMORY_BYTES = 1024 * 1024 * 1024  # message bodies a command builds at once (send_many copies each into its request)


def check_in_memory(size: int, messages: int, *, lower: str) -> None:
    """ValueError (one line, exit code 2) unless `messages` bodies of `size` bytes fit IN_MEMORY_BYTES;
    it tells the user to lower `lower` (the command's options that set them)."""
    if size * messages > IN_MEMORY_BYTES:
        raise ValueError(
            f"{messages} messages of {size} B at once is over {IN_MEMORY_BYTES >> 30} GiB in memory: lower {lower}"
        )


def client_options(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--endpoint",
        default=env("POPGATE_ENDPOINT", "127.0.0.1:8081"),
        help="proxy HOST:PORT (env POPGATE_ENDPOINT, else 127.0.0.1:8081)",
    )
    parser.add_argument("--access-key", default=env("POPGATE_ACCESS_KEY"), help="v2 credentials (env too)")
    parser.add_argument("--secret-key", default=env("POPGATE_SECRET_KEY"), help="v2 credentials (env too)")
    parser.add_argument("--tls", action="store_true", help="TLS with the system's root certificates")
    parser.add_argument("--tls-ca", type=Path, help="TLS with these PEM root certificates")


def connection(args: argparse.Namespace) -> dict[str, Any]:
    tls: bool | Path = args.tls_ca if args.tls_ca else bool(args.tls)
    if (args.access_key is None) != (args.secret_key is None):  # told as the options, not the SDK's arguments
        raise ValueError("give --access-key and --secret-key together (or POPGATE_ACCESS_KEY and POPGATE_SECRET_KEY)")
    return {"access_key": args.access_key, "secret_key": args.secret_key, "tls": tls}


# The SDK's hints name its arguments; a command's user is told its options.
_CLI_HINTS = {
    TLS_HINT: " (is the server using TLS? try --tls / --tls-ca)",
    CERT_HINT: " (the server's certificate does not verify: pass --tls-ca <the CA certificate file that signed it>)",
    PLAINTEXT_HINT: " (the server does not use TLS: drop --tls / --tls-ca)",
}


def explain(exc: errors.PopgateError) -> str:
    """The error for the user, the SDK's hints naming the command's options."""
    text = str(exc)
    for sdk_hint, cli_hint in _CLI_HINTS.items():
        text = text.replace(sdk_hint, cli_hint)
    return text


def progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


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


def add_parsers(sub: Sub) -> None:
    send = sub.add_parser("send", help="send messages to a topic")
    client_options(send)
    send.add_argument("topic")
    send.add_argument("body", nargs="?", help="message body ('-' = stdin; else --file, else --size generated bytes)")
    send.add_argument("--file", help="read the body from this file ('-' = stdin)")
    send.add_argument("--count", type=POSITIVE, default=1, help="messages to send")
    send.add_argument("--size", type=BODY_SIZE, default=256, help="generated body size when no body is given")
    send.add_argument("--rate", type=_rate, default=0.0, help="at most this many msg/s (0 = no limit, else 0.001..1e7)")
    send.add_argument("--batch", type=number(int, low=1, high=1024), default=256, help="messages per call (1..1024)")
    send.add_argument("--tag", help="message tag (consumers filter on it: receive --filter)")
    send.add_argument("--key", action="append", default=[], help="business key (repeatable)")
    send.add_argument("--property", action="append", default=[], help="KEY=VALUE user property (repeatable)")
    send.add_argument("--delay", type=DURATION, help="deliver this many seconds later")
    send.add_argument(
        "--group", dest="message_group", metavar="MESSAGE_GROUP", help="FIFO message group (not a consumer group)"
    )
    send.add_argument("--ids", action="store_true", help="print every message id")
    send.set_defaults(handler=send_command)

    receive = sub.add_parser("receive", help="receive (and ack) messages of a consumer group")
    client_options(receive)
    receive.add_argument("topic")
    receive.add_argument("--group", required=True, help="consumer group")
    receive.add_argument("--filter", default="*", help="tag filter: '*' or 'a || b'")
    receive.add_argument("--count", type=NON_NEGATIVE_INT, default=0, help="stop after this many (0 = until idle)")
    receive.add_argument("--wait", type=DURATION, default=5.0, help="stop when none came for this many seconds")
    receive.add_argument(
        "--invisible", type=POSITIVE_DURATION, default=30.0, help="invisibility of received messages, s"
    )
    receive.add_argument("--batch", type=number(int, low=1, high=32), default=32, help="messages per call (1..32)")
    receive.add_argument(
        "--format",
        choices=["text", "json", "body"],
        default="text",
        help="text: a line per message; json: an object per line; body: raw body bytes, each followed by a newline",
    )
    receive.add_argument(
        "--no-ack",
        action="store_true",
        help="look without consuming: each message once, stopping at the first one shown already; each look "
        "uses one delivery attempt of every message shown, and hides it for --invisible",
    )
    receive.set_defaults(handler=receive_command)


def _body(args: argparse.Namespace) -> bytes:
    """The body argument, else --file, ('-' = stdin for either), else --size generated bytes."""
    if args.body is not None and args.file:
        raise ValueError(f"give the body as an argument ({args.body[:20]!r}) or with --file, not both")
    source = args.body if args.body is not None else args.file
    if source == "-":
        return sys.stdin.buffer.read()
    if args.body is not None:
        return str(args.body).encode()
    if args.file:
        return Path(args.file).read_bytes()  # OSError: one line and code 2 (cli.main)
    return os.urandom(args.size // 2 + 1).hex()[: args.size].encode()


def _properties(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--property {pair!r}: expected KEY=VALUE")
        out[key] = value
    return out


def _rate(text: str) -> float:
    rate = number(float, low=0.0, high=1e7)(text)
    if 0 < rate < 1e-3:  # a message every 1,000 s or more: sleeps past what the clock can represent
        raise argparse.ArgumentTypeError(f"must be 0 or 0.001..1e7, got {text}")
    return rate


def paced(total: int, batch: int, rate: float) -> Iterator[int]:
    """Batch sizes to send, each yielded no earlier than `rate` allows for everything sent so far.

    A batch of n goes once ``started + (sent + n) / rate`` has passed, so the average rate
    from the start to any point never exceeds `rate` (0 = no limit).
    """
    started, sent = time.monotonic(), 0
    while sent < total:
        n = min(batch, total - sent)
        if rate > 0:
            n = min(n, max(1, int(rate / 10)))  # ~10 calls a second keeps the pace smooth
            ahead = started + (sent + n) / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)  # pacing, not synchronisation
        yield n
        sent += n


def error_console() -> Console:
    """stderr for the commands: plain text, never wrapped (an error is one line, also in a pipe or a log)."""
    return Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)


class IdleWait:
    """How long each receive of a command waits: until ``wait`` seconds pass with nothing received,
    restarted by every batch; always at least one poll (``--wait 0`` polls once without waiting)."""

    def __init__(self, wait: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.wait = wait
        self.clock = clock
        self.until = clock() + wait
        self.polled = False

    def next(self) -> float | None:
        """The next receive's wait in seconds (at most 1 s, so Ctrl-C is prompt), or None: stop."""
        left = self.until - self.clock()
        if left <= 0 and self.polled:
            return None
        self.polled = True
        return min(max(left, 0.0), 1.0)

    def received(self) -> None:
        self.until = self.clock() + self.wait


class OnePass:
    """What `receive --no-ack` shows: each message once, and no more once one comes round again.

    A message not acked comes back after the invisible time with one more delivery attempt. Reading on
    would show it again, and again, until it has used every attempt and is dead-lettered: a backlog that
    takes longer than --invisible to print went to the DLQ.
    """

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.over = False

    def new(self, batch: list[Message]) -> list[Message]:
        """The batch's messages not shown yet; any other ends the pass (`over`)."""
        fresh = []
        for message in batch:
            if message.message_id in self.seen:
                self.over = True
            else:
                self.seen.add(message.message_id)
                fresh.append(message)
        return fresh


def _plural(n: int, word: str = "message") -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def send_command(args: argparse.Namespace) -> int:
    if args.message_group and args.delay:  # the SDK would name its own arguments
        raise ValueError("--group (a FIFO message group) and --delay cannot be used together")
    err = error_console()
    body = _body(args)
    generated = args.body is None and not args.file
    check_in_memory(len(body), min(args.batch, args.count), lower="--size or --batch" if generated else "--batch")
    options = {
        "tag": args.tag,
        "keys": args.key,
        "properties": _properties(args.property),
        "delay": args.delay,
        "message_group": args.message_group,
    }
    started = time.perf_counter()
    sent, code = 0, 0
    with Producer(args.endpoint, **connection(args)) as producer, progress(err) as bar:
        task = bar.add_task(f"send {args.topic}", total=args.count, rate="")
        try:
            for n in paced(args.count, args.batch, args.rate):
                receipts = producer.send_many(args.topic, [body] * n, **options)
                sent += n
                if args.ids or args.count == 1:
                    print("\n".join(r.message_id for r in receipts), flush=True)
                elapsed = time.perf_counter() - started
                bar.update(task, advance=n, rate=f"{sent / max(elapsed, 1e-9):,.0f} msg/s")
        except errors.PopgateError as exc:
            err.print(f"popgate send: {explain(exc)} (after {sent} sent)", style="red")
            return 1
        except KeyboardInterrupt:
            code = 130
    elapsed = time.perf_counter() - started
    each = " each" if sent != 1 else ""
    # The summary on stderr, as `receive`'s: stdout holds only the ids (`id=$(popgate send t hello)`).
    err.print(
        f"sent {_plural(sent)} ({len(body)} B{each}) to {args.topic} "
        f"in {elapsed:.2f} s ({sent / max(elapsed, 1e-9):,.0f} msg/s){' (interrupted)' if code else ''}"
    )
    return code


def _render(message: Message, fmt: str) -> str:
    if fmt == "json":
        try:
            body: dict[str, str] = {"body": message.body.decode()}
        except UnicodeDecodeError:
            body = {"body_base64": base64.b64encode(message.body).decode()}
        record = {
            "topic": message.topic,
            "message_id": message.message_id,
            "tag": message.tag,
            "keys": list(message.keys),
            "properties": dict(message.properties),
            "attempt": message.attempt,
            "born_at": message.born_at,
            "stored_at": message.stored_at,
            **body,
        }
        return json.dumps(record, ensure_ascii=False)
    tag = f" tag={message.tag}" if message.tag is not None else ""
    return f"{message.message_id} attempt={message.attempt}{tag} {message.text()[:200]!r}"


def _write(message: Message, fmt: str) -> None:
    """One message to stdout exactly as it is (no markup, no emoji codes; `body` as raw bytes)."""
    if fmt == "body":
        sys.stdout.flush()  # what the text layer holds goes first
        sys.stdout.buffer.write(message.body + b"\n")
    else:
        sys.stdout.write(_render(message, fmt) + "\n")


def _stdout_is_a_pipe() -> bool:
    """A pipe or socket: its reader can go away (`| head -1`) with what was written never read."""
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@dataclass
class _Tally:
    got: int = 0
    acked: int = 0


def _print_and_ack(consumer: SimpleConsumer, batch: list[Message], tally: _Tally, *, fmt: str, ack: bool) -> None:
    """Write the batch, and ack each message only once it is out (when `ack`), counted in `tally`.

    Into a pipe each message is acked right after it is written, so a reader gone (`| head -1` exited)
    stops the acks at the next message: its write fails (EPIPE), it and the rest of the batch are not
    acked (they come back after the invisible time), and BrokenPipeError goes on to the caller. A pipe's
    buffer may still take a message its reader never reads: that one is acked. Into a file or a terminal
    the batch is written, then acked in one call.
    """
    each = ack and _stdout_is_a_pipe()
    written = 0
    try:
        for message in batch:
            _write(message, fmt)
            if each:
                sys.stdout.flush()  # a reader gone fails here, before the ack
            written += 1
            if each:
                consumer.ack(message)
                tally.acked += 1
        sys.stdout.flush()  # the batch is out before its one ack
    except BrokenPipeError:
        if ack and not each and written:
            consumer.ack_many(batch[:written])
            tally.acked += written
        raise
    if ack and not each:
        consumer.ack_many(batch)
        tally.acked += len(batch)


def receive_command(args: argparse.Namespace) -> int:
    err = error_console()
    consumer = SimpleConsumer(
        args.endpoint,
        args.group,
        {args.topic: args.filter},
        batch=args.batch,
        invisible=args.invisible,
        **connection(args),
    )
    tally, code, look = _Tally(), 0, OnePass()
    try:
        with consumer:
            idle = IdleWait(args.wait)
            while (args.count == 0 or tally.got < args.count) and not look.over and (wait := idle.next()) is not None:
                want = args.batch if args.count == 0 else min(args.batch, args.count - tally.got)
                batch = consumer.receive(max=want, wait=wait)
                if not batch:
                    continue
                idle.received()
                if args.no_ack:
                    batch = look.new(batch)
                tally.got += len(batch)
                _print_and_ack(consumer, batch, tally, fmt=args.format, ack=not args.no_ack)
    except errors.PopgateError as exc:
        err.print(f"popgate receive: {explain(exc)} (after {tally.got} received)", style="red")
        return 1
    except KeyboardInterrupt:  # a printed but not yet acked batch comes back after --invisible
        code = 130
    got, acked = tally.got, tally.acked
    if args.no_ack:
        summary = f"received {_plural(got)}"
    elif acked == got:
        summary = f"received and acked {_plural(got)}"
    else:
        summary = f"received {_plural(got)} ({acked} acked)"
    stopped = " (interrupted)" if code else ""
    if look.over:
        stopped += "; stopped at the first message shown already (--no-ack looks once)"
    err.print(f"{summary} from {args.topic} (group {args.group}){stopped}")
    return code
