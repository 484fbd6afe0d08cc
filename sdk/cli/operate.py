"""`popgate group reset|delete|consumers`, `popgate topic create|delete` and `popgate lookup`: operating a
cluster through the proxy's admin service (`-e/--endpoint`, proxy_admin.py), which asks every broker, or — for a
proxy-less emergency — each broker given with `--broker NAME=HOST:PORT` directly.

Every operation goes to every broker. One that did not answer is named on stderr, and the exit code is
BROKERS_MISSING (75): a reset or a delete then took effect on the brokers that answered only, and is safe to run
again once the others are back (docs/SDK.md, "Operating a cluster"). Resets and deletes ask for confirmation on a
terminal; `--yes` answers it for scripts, and without a terminal and without `--yes` they refuse with
NOT_CONFIRMED (77) — tests/integration/sdk/test_operate.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from popgate_pb import broker_pb2 as bpb

from popgate_contract.consumers import latest_consumers
from popgate_contract.validation import DLQ_RESEND_GROUP as RESEND_GROUP

from .admin import broker_options
from .fanout import fan_out, finish
from .options import (
    DURATION,
    POSITIVE_DURATION,
    Sub,
    client_options,
    group_name,
    json_option,
    number,
    topic_name,
    utf8_text,
)
from .output import as_json, json_error, terminal_text
from .proxy_admin import ProxyAdminError

USAGE = 2  # as argparse's: the command line asks for what it will not do without --force
NOT_CONFIRMED = 77  # sysexits.h EX_NOPERM: a reset or delete the user did not confirm (docs/SDK.md, "Exit codes")
To = bpb.ResetOffsetRequest.To


class NotConfirmed(Exception):
    """A dangerous operation was not confirmed: declined, or no terminal to ask on and no --yes."""


def _common(parser: argparse.ArgumentParser, *, dangerous: bool = False) -> None:
    client_options(parser)
    broker_options(parser)
    for action in parser._actions:
        if action.dest == "broker":  # only given on the command line: POPGATE_BROKERS does not bypass the proxy
            action.help = "NAME=HOST:PORT of a broker to ask directly instead of the proxy (repeatable; every broker)"
    parser.add_argument("--timeout", type=POSITIVE_DURATION, default=3.0, help="per-broker deadline")
    json_option(parser)
    if dangerous:
        parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation (for scripts)")


def add_parsers(sub: Sub) -> None:
    group = sub.add_parser("group", help="operate a consumer group: reset its offsets, delete it, list its consumers")
    gsub = group.add_subparsers(dest="group_command", required=True, metavar="{reset,delete,consumers}")
    reset = gsub.add_parser("reset", help="move a group's offsets on a topic to earliest, latest or a time")
    reset.add_argument("group", type=group_name, help="consumer group")
    reset.add_argument("-t", "--topic", type=topic_name, required=True, help="the topic whose offsets move")
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--earliest", action="store_true", help="the first message kept")
    where.add_argument("--latest", action="store_true", help="after the last message: only new ones")
    where.add_argument("--to-time", metavar="TIME", help="the first message stored at or after TIME (ISO 8601)")
    where.add_argument("--ago", type=DURATION, metavar="DURATION", help="the first message stored DURATION ago")
    _common(reset, dangerous=True)
    reset.set_defaults(handler=reset_command)
    delete = gsub.add_parser("delete", help="forget a group's offsets and deliveries on every broker")
    delete.add_argument("group", type=group_name, help="consumer group")
    delete.add_argument("-t", "--topic", default="", help="only its state on this topic (default: every topic)")
    delete.add_argument("--dlq", action="store_true", help="also delete its dead-letter topic %%DLQ%%<group>")
    delete.add_argument(
        "--force",
        action="store_true",
        help=f"delete {RESEND_GROUP} too (`dlq resend`'s own group: its next runs send every letter still in a DLQ"
        " again)",
    )
    _common(delete, dangerous=True)
    delete.set_defaults(handler=delete_group_command)
    consumers = gsub.add_parser("consumers", help="the group's live consumers: client ids, proxy, last seen")
    consumers.add_argument("group", type=group_name, help="consumer group")
    _common(consumers)
    consumers.set_defaults(handler=consumers_command)
    _topic_parsers(sub)


def _topic_parsers(sub: Sub) -> None:
    topic = sub.add_parser("topic", help="create or delete a topic on every broker")
    tsub = topic.add_subparsers(dest="topic_command", required=True, metavar="{create,delete}")
    create = tsub.add_parser("create", help="create a topic on every broker (needed when brokers do not auto-create)")
    create.add_argument("topic", type=topic_name, help="topic name")
    create.add_argument(
        "--queues",
        type=number(int, low=1, high=256),
        default=None,
        help="queues on each broker (default: each broker's --queues-per-topic)",
    )
    _common(create)
    create.set_defaults(handler=create_topic_command)
    drop = tsub.add_parser("delete", help="delete a topic's messages and every group's state on it")
    drop.add_argument("topic", type=topic_name, help="topic name")
    _common(drop, dangerous=True)
    drop.set_defaults(handler=delete_topic_command)

    lookup = sub.add_parser("lookup", help="messages of a topic by message id or key, newest first")
    lookup.add_argument("topic", type=topic_name, help="topic name")
    what = lookup.add_mutually_exclusive_group(required=True)
    what.add_argument("--id", dest="message_id", type=utf8_text, help="message id")
    what.add_argument("--key", type=utf8_text, help="message key")
    lookup.add_argument("-n", "--count", type=number(int, low=1, high=1000), default=10, help="at most this many")
    lookup.add_argument("--body", action="store_true", help="print bodies too")
    lookup.add_argument(
        "--max-scan",
        type=number(int, low=1),
        default=None,
        help="newest messages each broker looks at (default and most: 100000)",
    )
    _common(lookup)
    lookup.set_defaults(handler=lookup_command)


def confirm(args: argparse.Namespace, question: str) -> None:
    """NotConfirmed unless --yes, or the user answers yes on the terminal."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise NotConfirmed(f"{question}: not confirmed (no terminal to ask on): give --yes to run it from a script")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise NotConfirmed(f"{question}: not confirmed")


def _run(args: argparse.Namespace, body: Any) -> int:
    try:
        return int(body())
    except NotConfirmed as exc:
        code, line = NOT_CONFIRMED, f"{args.parser.prog}: {exc}"
    except ProxyAdminError as exc:
        code, line = 1, f"{args.parser.prog}: {exc}"
    print(line, file=sys.stderr)
    json_error(args.json, line)
    return code


def _reset_target(args: argparse.Namespace) -> tuple[bpb.ResetOffsetRequest.To, int, str]:
    if args.earliest:
        return To.EARLIEST, 0, "the earliest message"
    if args.latest:
        return To.LATEST, 0, "the latest (only new messages)"
    if args.ago is not None:
        ms = int((time.time() - args.ago) * 1000)
    else:
        try:
            moment = datetime.fromisoformat(args.to_time)
        except ValueError:
            raise ValueError(f"--to-time {args.to_time!r}: expected ISO 8601, such as 2026-11-28T12:00:00Z") from None
        ms = int(moment.astimezone().timestamp() * 1000)  # a time without a zone is local time
    shown = datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")
    return To.TIMESTAMP, ms, f"messages stored from {shown}"


def reset_command(args: argparse.Namespace) -> int:
    to, ms, said = _reset_target(args)
    request = bpb.ResetOffsetRequest(topic=args.topic, group=args.group, to=to, timestamp_ms=ms)

    def body() -> int:
        confirm(args, f"reset group {args.group} on topic {args.topic} to {said}, on every broker?")
        fanned = fan_out(args, "ResetOffset", request, f"reset {args.group}")
        if fanned.answers and not any(a.queues for a in fanned.answers):
            line = f"{args.parser.prog}: topic {args.topic} exists on no broker that answered"
            print(line, file=sys.stderr)
            if not fanned.failures:
                json_error(args.json, line)
                return 1
            # It may be on one that did not: named, with "run again" and BROKERS_MISSING (_finish) —
            # test_operate.py::test_a_reset_of_a_topic_only_a_broker_down_has_names_that_broker
        lines = [
            f"{a.broker}: {len(a.queues)} queue(s) at offsets {', '.join(str(q.offset) for q in a.queues)};"
            f" {sum(q.dropped_inflight for q in a.queues)} in-flight deliveries dropped"
            if a.queues
            else f"{a.broker}: no such topic"
            for a in sorted(fanned.answers, key=lambda a: a.broker)
        ]
        document = {"timestamp_ms": ms, "answers": [as_json(a) for a in fanned.answers]}
        return finish(args, fanned, document, lines, change=True)

    return _run(args, body)


def _everywhere(
    args: argparse.Namespace,
    method: str,
    request: Any,
    what: str,
    line: Callable[[Any], str],
    question: str = "",
    *,
    absent: tuple[Callable[[Any], bool], str] | None = None,
) -> int:
    """A change at every broker (after `question` is confirmed, when there is one): a line per broker's answer.
    `absent`: whether an answer found nothing to change, and what to say on stderr when every broker answered so
    (a mistyped name) — tests/integration/sdk/test_operate.py::test_deleting_what_no_broker_has_says_so."""

    def body() -> int:
        if question:
            confirm(args, question)
        fanned = fan_out(args, method, request, what)
        lines = [line(a) for a in sorted(fanned.answers, key=lambda a: a.broker)]
        if absent is not None and fanned.answers and not fanned.failures and all(map(absent[0], fanned.answers)):
            print(f"{args.parser.prog}: {absent[1]}", file=sys.stderr)
        document = {"answers": [as_json(a) for a in fanned.answers]}
        return finish(args, fanned, document, lines, change=True)

    return _run(args, body)


def delete_group_command(args: argparse.Namespace) -> int:
    # tests/integration/sdk/test_operate.py::test_dlq_resends_own_group_is_kept_unless_forced
    if args.group == RESEND_GROUP and not args.force:
        refusal = (
            f"{args.parser.prog}: {RESEND_GROUP} is `popgate dlq resend`'s own group, which knows the letters it"
            " re-sent: deleted, its next runs send every letter still in a DLQ again; give --force to delete it"
        )
        print(refusal, file=sys.stderr)
        json_error(args.json, refusal)
        return USAGE
    request = bpb.DeleteGroupRequest(group=args.group, topic=args.topic, delete_dlq=args.dlq)
    scope = f" on topic {args.topic}" if args.topic else ""
    dlq = " and its dead-letter topic" if args.dlq else ""

    def line(a: bpb.DeleteGroupResponse) -> str:
        done = f"state on {', '.join(a.topics)} deleted" if a.topics else "had no state of it"
        return f"{a.broker}: {done}" + ("; dead-letter topic deleted" if a.dlq_deleted else "")

    question = f"delete consumer group {args.group}{scope}{dlq} on every broker?"
    absent = (
        lambda a: not a.topics and not a.dlq_deleted,
        f"no broker has state of group {args.group}{scope}{dlq}: nothing was deleted (`popgate stats` lists groups)",
    )
    return _everywhere(args, "DeleteGroup", request, f"delete group {args.group}", line, question, absent=absent)


def create_topic_command(args: argparse.Namespace) -> int:
    request = bpb.CreateTopicRequest(topic=args.topic, queues=args.queues or 0)

    def line(a: bpb.CreateTopicResponse) -> str:
        return f"{a.broker}: {'created' if a.created else 'exists'} with {a.queues} queue(s)"

    return _everywhere(args, "CreateTopic", request, f"create topic {args.topic}", line)


def delete_topic_command(args: argparse.Namespace) -> int:
    request = bpb.DeleteTopicRequest(topic=args.topic)

    def line(a: bpb.DeleteTopicResponse) -> str:
        if not a.existed:
            said = f"{a.broker}: had no such topic"
        else:
            groups = ", ".join(a.groups) or "-"
            said = (
                f"{a.broker}: deleted {a.messages} message(s), groups {groups}; {a.held_ended} held receive(s) answered"
            )
        if a.rows_deleting:
            said += "; its stored messages are still being deleted: it can be made again once that ends"
        return said

    question = f"delete topic {args.topic}, its messages and every group's state on it, on every broker?"
    absent = (lambda a: not a.existed, f"no broker has topic {args.topic}: nothing was deleted")
    return _everywhere(args, "DeleteTopic", request, f"delete topic {args.topic}", line, question, absent=absent)


def consumers_command(args: argparse.Namespace) -> int:
    request = bpb.ListConsumersRequest(group=args.group)

    def body() -> int:
        fanned = fan_out(args, "ListConsumers", request, f"list the consumers of {args.group}")
        rows = latest_consumers(c for a in fanned.answers for c in a.consumers)
        now = time.time()
        lines = [
            terminal_text(f"{c.client_id}  via {c.proxy}  last seen {now - c.last_seen_ms / 1000:.1f}s ago")
            for c in rows
        ]
        lines.append(f"{len(rows)} live consumer(s) of {args.group}")
        document = {"group": args.group, "consumers": [as_json(c) for c in rows]}
        return finish(args, fanned, document, lines, change=False)

    return _run(args, body)


def lookup_command(args: argparse.Namespace) -> int:
    request = bpb.QueryMessagesRequest(
        topic=args.topic,
        message_id=args.message_id or "",
        key=args.key or "",
        max_messages=args.count,
        with_body=args.body,
        max_scan=args.max_scan or 0,
    )

    def body() -> int:
        fanned = fan_out(args, "QueryMessages", request, f"look up messages of {args.topic}")
        found = [m for a in fanned.answers for m in a.messages]
        found.sort(key=lambda m: (m.stored.store_ms, m.broker, m.stored.queue_id, m.stored.offset), reverse=True)
        found = found[: args.count]
        lines = [_found_line(m, args.body) for m in found]
        cut = any(a.scan_cut for a in fanned.answers)
        lines.append(
            f"{len(found)} message(s)"
            + (" (older messages left out: past --max-scan, or a broker's answer size limit)" if cut else "")
        )
        document = {"messages": [as_json(m) for m in found], "scan_cut": cut}
        return finish(args, fanned, document, lines, change=False)

    return _run(args, body)


def _found_line(m: bpb.FoundMessage, with_body: bool) -> str:
    s = m.stored
    stored = datetime.fromtimestamp(s.store_ms / 1000).astimezone().isoformat(timespec="milliseconds")
    props = " ".join(f"{k}={v}" for k, v in sorted(s.message.properties.items()))
    line = (
        f"{s.message.message_id}  {m.broker}/{s.message.topic}/{s.queue_id}/{s.offset}  stored {stored}"
        f"  {m.body_size} B  keys={','.join(s.message.keys) or '-'}  tag={s.message.tag or '-'}  {props}"
    ).rstrip()
    return f"{terminal_text(line)}\n  body: {s.message.body!r}" if with_body else terminal_text(line)
