"""`popgate receive`; `add_parsers` adds it beside `send` (`sending`) and `recall` (`producing`)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import errors
from ..client import SimpleConsumer
from ..message import Message
from . import producing, sending
from .options import (
    DURATION,
    NON_NEGATIVE_INT,
    POSITIVE_DURATION,
    SDK_BATCH,
    SDK_INVISIBLE_S,
    SDK_WAIT_S,
    Sub,
    check_listening,
    client_options,
    connection,
    group_name,
    number,
    quiet_option,
    topic_name,
    utf8_text,
)
from .output import closed_at_end, error_console, explain, msg_rate, plural, progress, stdout_is_a_terminal


def add_parsers(sub: Sub) -> None:
    sending.add_parser(sub)
    _receive_parser(sub)
    producing.add_parsers(sub)


def _receive_parser(sub: Sub) -> None:
    receive = sub.add_parser("receive", help="receive (and ack) messages of a consumer group")
    client_options(receive)
    receive.add_argument("topic", type=topic_name)
    receive.add_argument("-g", "--group", type=group_name, required=True, help="consumer group")
    receive.add_argument("--filter", type=utf8_text, default="*", help="tag filter: '*' or 'a || b'")
    receive.add_argument(
        "-n", "--count", type=NON_NEGATIVE_INT, default=0, help="stop after this many (0 = until idle)"
    )
    receive.add_argument(
        "-w", "--wait", type=DURATION, default=SDK_WAIT_S, help="stop when none came for this long (0 = one poll)"
    )
    receive.add_argument(
        "--invisible", type=POSITIVE_DURATION, default=SDK_INVISIBLE_S, help="invisibility of received messages"
    )
    receive.add_argument(
        "-b", "--batch", type=number(int, low=1, high=32), default=SDK_BATCH, help="messages per call (1..32)"
    )
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
    quiet_option(receive)
    receive.set_defaults(handler=receive_command)


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
    acking: int = 0  # in an ack call not yet answered: acked or not when Ctrl-C cuts it short


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
                _ack(consumer, [message], tally)
        sys.stdout.flush()  # the batch is out before its one ack
    except BrokenPipeError:
        if ack and not each and written:
            _ack(consumer, batch[:written], tally)
        raise
    if ack and not each:
        _ack(consumer, batch, tally)


def _ack(consumer: SimpleConsumer, messages: list[Message], tally: _Tally) -> None:
    tally.acking = len(messages)
    consumer.ack_many(messages)
    tally.acked += len(messages)
    tally.acking = 0


def receive_command(args: argparse.Namespace) -> int:
    if sys.stdout is None:  # started with stdout closed (`>&-`): said before a message is received, not after
        raise ValueError("stdout is closed")
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
    # Progress only when stdout is not the terminal: there the messages themselves show it.
    shown = progress(err, quiet=args.quiet or stdout_is_a_terminal(), redirect_stdout=False)
    try:
        with closed_at_end(consumer):
            check_listening(args.endpoint)
            with shown as bar:
                task = bar.add_task(f"receive {args.topic}", total=args.count or None, rate="")
                started = time.perf_counter()

                def advance(n: int) -> None:
                    bar.update(task, advance=n, rate=msg_rate(tally.got, time.perf_counter() - started))

                _receive(consumer, args, tally, look, advance)
    except errors.PopgateError as exc:
        err.print(f"popgate receive: {explain(exc)} (after {tally.got} received)", style="red")
        return 1
    except KeyboardInterrupt:  # a printed but not yet acked batch comes back after --invisible
        code = 130
    if not args.quiet:
        err.print(_received(args, tally, look, interrupted=code != 0))
    return code


def _receive(
    consumer: SimpleConsumer, args: argparse.Namespace, tally: _Tally, look: OnePass, advance: Callable[[int], None]
) -> None:
    """Receive, print and ack (unless --no-ack) until --count, idle for --wait, or a look came round again."""
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
        advance(len(batch))


def _received(args: argparse.Namespace, tally: _Tally, look: OnePass, *, interrupted: bool) -> str:
    """The summary line of a receive."""
    got, acked = tally.got, tally.acked
    if args.no_ack:
        summary = f"received {plural(got)}"
    elif acked == got:
        summary = f"received and acked {plural(got)}"
    elif tally.acking:  # test_interrupted.py::test_receive_counts_an_ack_cut_short_by_ctrl_c_as_unknown
        summary = f"received {plural(got)} ({acked} acked, {tally.acking} in an ack cut short: acked, or back later)"
    else:
        summary = f"received {plural(got)} ({acked} acked)"
    stopped = " (interrupted)" if interrupted else ""
    if look.over:
        stopped += "; stopped at the first message shown already (--no-ack looks once)"
    return f"{summary} from {args.topic} (group {args.group}){stopped}"
