"""`popgate dlq list|resend`: the dead letters of a consumer group, listed or sent back to their topics.

`dlq list` asks the brokers, through the proxy's admin service given only ``-e/--endpoint`` or directly at the
``--broker`` addresses (as `stats` does, `admin.py`), and consumes nothing. `dlq resend` (`dlq_resend.py`) needs
no broker address: it consumes ``%DLQ%<group>`` through the proxy with its own consumer group (so each dead letter
is re-sent once) and sends every message back to its ORIGIN_TOPIC.
"""

from __future__ import annotations

import argparse
import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc as bpb_grpc
from rich.table import Table

from popgate_contract.validation import DLQ_PREFIX
from popgate_contract.validation import DLQ_RESEND_GROUP as RESEND_GROUP

from .admin import Broker, broker_channel, broker_options, err, failure, given_brokers, name_column, proxy_options
from .dlq_resend import dlq_resend_command
from .options import (
    DURATION,
    NON_NEGATIVE_INT,
    POSITIVE_DURATION,
    Sub,
    client_options,
    group_name,
    json_option,
    number,
    quiet_option,
)
from .output import json_error, print_json, print_table, terminal_text
from .proxy_admin import ProxyAdmin, ProxyAdminError

LIST_LIMIT = number(int, low=1, high=1000)


def add_parsers(sub: Sub) -> None:
    dlq = sub.add_parser("dlq", help="dead-lettered messages of a group: list or resend")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="{list,resend}")
    listing = dlq_sub.add_parser("list", help="list the letters of %%DLQ%%<group> not yet re-sent (consumes nothing)")
    broker_options(listing)
    proxy_options(listing)
    listing.add_argument("group", type=group_name, help="consumer group whose dead letters to list")
    listing.add_argument(
        "--limit", type=LIST_LIMIT, default=100, help="at most this many messages (1..1000, a broker's ListMessages)"
    )
    listing.add_argument("--timeout", type=POSITIVE_DURATION, default=3.0, help="per-broker deadline")
    listing.add_argument("--all", action="store_true", help="every stored dead letter, also those already re-sent")
    listing.add_argument(
        "--resend-group", default=RESEND_GROUP, help="the group `dlq resend` used: its acked letters are not listed"
    )
    json_option(listing)
    listing.set_defaults(handler=dlq_list_command)
    resend = dlq_sub.add_parser("resend", help="send dead letters back to their original topic (through the proxy)")
    client_options(resend)
    resend.add_argument("group", type=group_name, help="consumer group whose dead letters to re-send")
    resend.add_argument("-n", "--count", type=NON_NEGATIVE_INT, default=0, help="at most this many (0 = all)")
    # Shorter than receive's: a DLQ is a finite backlog, filled only as messages use up their attempts.
    resend.add_argument("-w", "--wait", type=DURATION, default=2.0, help="stop when none came for this long")
    resend.add_argument("--resend-group", default=RESEND_GROUP, help="consumer group that reads the DLQ")
    quiet_option(resend)
    resend.set_defaults(handler=dlq_resend_command)


@dataclass
class DeadLetters:
    """What `dlq list` found in ``%DLQ%<group>`` over the brokers that answered."""

    messages: list[bpb.StoredMessage] = field(default_factory=list)
    answered: int = 0  # brokers
    stored: int = 0  # every letter kept (until retention deletes it, --retention-s)
    pending: int = 0  # not yet re-sent: the resend group's backlog, or every letter before it first read
    resent_listed: int = 0  # of the listed range, letters the resend group acked out of order (not told which)


BODY_SHOWN = 40  # bytes of each dead letter's body `dlq list` shows (and keeps)


def _resend_state(stats: bpb.StatsResponse, topic: str, resend_group: str) -> dict[int, bpb.GroupQueueStats]:
    """The resend group's state on each DLQ queue it has read (queue id -> its Stats row)."""
    return {g.queue_id: g for g in stats.groups if g.topic == topic and g.group == resend_group}


def _dlq_ranges(
    stats: bpb.StatsResponse, topic: str, resend_group: str, *, everything: bool
) -> list[tuple[int, int, int]]:
    """(queue id, first offset to list, max offset) per non-empty DLQ queue: from the resend group's consumer
    offset (all below it is re-sent) when it has read the queue, else from the first letter."""
    read = _resend_state(stats, topic, resend_group)
    ranges = []
    for q in stats.queues:
        if q.topic != topic or q.max_offset <= q.min_offset:
            continue
        state = None if everything else read.get(q.queue_id)
        start = max(q.min_offset, state.consumer_offset) if state else q.min_offset
        if start < q.max_offset:
            ranges.append((q.queue_id, start, q.max_offset))
    return ranges


def _count_dead_letters(found: DeadLetters, stats: bpb.StatsResponse, topic: str, resend_group: str) -> None:
    read = _resend_state(stats, topic, resend_group)
    for q in stats.queues:
        if q.topic != topic:
            continue
        stored = q.max_offset - q.min_offset
        found.stored += stored
        state = read.get(q.queue_id)
        found.pending += state.lag if state else stored
        if state:
            found.resent_listed += max(0, q.max_offset - max(q.min_offset, state.consumer_offset) - state.lag)


def list_dead_letters(
    brokers: list[Broker],
    group: str,
    *,
    limit: int,
    timeout: float,
    resend_group: str = RESEND_GROUP,
    everything: bool = False,
) -> DeadLetters:
    """Up to `limit` letters of ``%DLQ%<group>`` not yet re-sent by `resend_group` (every stored one when
    `everything`), with the counts over the brokers that answered (failures on stderr). Each body is cut to its
    first `BODY_SHOWN` bytes as its page arrives: a listing holds a page, not up to `limit` bodies of 4 MiB."""
    topic = DLQ_PREFIX + group
    found = DeadLetters()
    for broker in brokers:
        with broker_channel(broker) as channel:
            stub = bpb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]

            def page(request: bpb.ListMessagesRequest, stub: Any = stub, broker: Broker = broker) -> Any:
                return stub.ListMessages(request, timeout=timeout, metadata=broker.metadata)

            try:
                stats = stub.Stats(bpb.StatsRequest(topic=topic), timeout=timeout, metadata=broker.metadata)
                _gather(found, stats, page, topic, resend_group, limit=limit, everything=everything)
            except grpc.RpcError as exc:
                err(f"popgate dlq list: broker {broker.name} at {broker.target}: {failure(exc.code())}")
    return found


def list_dead_letters_via_proxy(
    args: argparse.Namespace, *, limit: int, timeout: float, resend_group: str, everything: bool
) -> tuple[DeadLetters, int]:
    """`list_dead_letters` through the proxy's admin service: the letters, and how many brokers the proxy asked.
    ProxyAdminError when the proxy itself fails."""
    topic = DLQ_PREFIX + args.group
    found = DeadLetters()
    with ProxyAdmin(args, timeout) as proxy:
        gathered = proxy.stats(bpb.StatsRequest(topic=topic))
        for name, code in sorted(gathered.failures.items()):
            err(f"popgate dlq list: broker {name} (asked by the proxy at {args.endpoint}): {code}")
        for name, stats in sorted(gathered.answers.items()):

            def page(request: bpb.ListMessagesRequest, name: str = name) -> bpb.ListMessagesResponse:
                return proxy.list_messages(name, request)

            try:
                _gather(found, stats, page, topic, resend_group, limit=limit, everything=everything)
            except ProxyAdminError as exc:
                err(f"popgate dlq list: {exc}")
    return found, len(gathered.answers) + len(gathered.failures)


def _gather(
    found: DeadLetters,
    stats: bpb.StatsResponse,
    page: Callable[[bpb.ListMessagesRequest], bpb.ListMessagesResponse],
    topic: str,
    resend_group: str,
    *,
    limit: int,
    everything: bool,
) -> None:
    """One broker's letters and counts into `found`, its pages asked with `page`."""
    for queue_id, start, end in _dlq_ranges(stats, topic, resend_group, everything=everything):
        if len(found.messages) >= limit:
            break
        found.messages += _list_queue(page, topic, queue_id, start, end, limit=limit - len(found.messages))
    _count_dead_letters(found, stats, topic, resend_group)
    found.answered += 1


def _dlq_title(args: argparse.Namespace, found: DeadLetters, brokers: int) -> str:
    of = f", {found.answered} of {brokers} brokers" if found.answered < brokers else ""
    if args.all:
        return f"{DLQ_PREFIX}{args.group}: {found.stored} message(s) stored ({found.pending} not yet re-sent{of})"
    shown = f"; first {len(found.messages)} listed" if len(found.messages) < found.pending else ""
    return f"{DLQ_PREFIX}{args.group}: {found.pending} message(s) not yet re-sent ({found.stored} stored{shown}{of})"


def _list_queue(
    page: Callable[[bpb.ListMessagesRequest], bpb.ListMessagesResponse],
    topic: str,
    queue_id: int,
    start: int,
    end: int,
    *,
    limit: int,
) -> list[bpb.StoredMessage]:
    """Up to `limit` messages of one queue from `start`, page by page: a broker cuts a page at its byte budget
    (always one message at least), so a short page is not the end; `end` (the queue's max offset) is."""
    out: list[bpb.StoredMessage] = []
    offset = start
    while len(out) < limit and offset < end:
        request = bpb.ListMessagesRequest(
            topic=topic, queue_id=queue_id, from_offset=offset, limit=min(limit - len(out), 1000)
        )
        messages = page(request).messages
        if not messages:
            break
        for stored in messages:
            stored.message.body = stored.message.body[:BODY_SHOWN]
        out += messages
        offset = messages[-1].offset + 1
    return out


def dlq_list_command(args: argparse.Namespace) -> int:
    given = given_brokers(args)
    options = {"limit": args.limit, "timeout": args.timeout, "resend_group": args.resend_group, "everything": args.all}
    if given:
        found, asked = list_dead_letters(given, args.group, **options), len(given)
    else:
        try:
            found, asked = list_dead_letters_via_proxy(args, **options)
        except ProxyAdminError as exc:
            err(f"popgate dlq list: {exc}")
            json_error(args.json, f"popgate dlq list: {exc}")
            return 1
    if not found.answered:
        err(f"popgate dlq list: no broker answered; {DLQ_PREFIX}{args.group} not listed")
        json_error(args.json, f"popgate dlq list: no broker answered; {DLQ_PREFIX}{args.group} not listed")
        return 1
    if args.json:
        print_json(_dlq_document(args, found, asked))
        return 0
    table = Table(title=_dlq_title(args, found, asked))
    if found.resent_listed and not args.all:
        table.caption = (
            f"{found.resent_listed} listed letter(s) were already re-sent, behind one {args.resend_group} has not"
            " acked (the broker does not say which)"
        )
    for column in ("message id", "origin topic"):
        name_column(table, column)
    for column in ("attempts", "stored"):
        table.add_column(column, no_wrap=True)
    for column in ("tag", "body"):
        table.add_column(column, overflow="fold")
    for s in sorted(found.messages, key=lambda s: s.store_ms):
        m = s.message
        props = m.properties
        stored_at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s.store_ms / 1000))
        table.add_row(
            props.get("ORIGIN_MESSAGE_ID", m.message_id),
            props.get("ORIGIN_TOPIC", "?"),
            props.get("DELIVERY_ATTEMPTS", "?"),
            stored_at,
            terminal_text(m.tag) if m.HasField("tag") else "",
            terminal_text(m.body.decode(errors="replace")),
        )
    print_table(table)
    return 0


def _dlq_document(args: argparse.Namespace, found: DeadLetters, brokers: int) -> dict[str, Any]:
    """`dlq list --json`: the counts and the listed letters as one document (docs/SDK.md). A body is its first
    BODY_SHOWN bytes, as `body_prefix` text, or `body_prefix_base64` when those bytes are not UTF-8."""
    letters = []
    for s in sorted(found.messages, key=lambda s: s.store_ms):
        m, props = s.message, s.message.properties
        attempts = props.get("DELIVERY_ATTEMPTS", "")
        try:
            body: dict[str, str] = {"body_prefix": m.body.decode()}
        except UnicodeDecodeError:
            body = {"body_prefix_base64": base64.b64encode(m.body).decode()}
        letters.append(
            {
                "message_id": props.get("ORIGIN_MESSAGE_ID", m.message_id),
                "origin_topic": props.get("ORIGIN_TOPIC"),
                "delivery_attempts": int(attempts) if attempts.isdigit() else None,
                "stored_at": s.store_ms / 1000,
                "tag": m.tag if m.HasField("tag") else None,
                **body,
            }
        )
    return {
        "topic": DLQ_PREFIX + args.group,
        "stored": found.stored,
        "not_resent": found.pending,
        "resent_listed": found.resent_listed,
        "brokers": {"asked": brokers, "answered": found.answered},
        "messages": letters,
    }
