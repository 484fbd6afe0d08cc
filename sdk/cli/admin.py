"""`popgate stats` and `popgate dlq list|resend`.

Lag and stored messages are broker facts the v2 protocol does not carry, so `stats` and
`dlq list` ask the brokers themselves (broker.proto ``Stats`` and ``ListMessages``) at the
``--broker NAME=HOST:PORT`` addresses (what `popgate up` prints; env POPGATE_BROKERS, else the proxy's
POPGATE_BROKER).
`dlq resend` needs no broker address: it consumes ``%DLQ%<group>`` through the proxy
with its own consumer group (so each dead letter is re-sent once) and sends every
message back to its ORIGIN_TOPIC.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc as bpb_grpc
from rich.table import Table

from popgate_contract.broker_token import TOKEN_KEY
from popgate_contract.errors import DomainError
from popgate_contract.lag import lag_seconds
from popgate_contract.validation import DLQ_PREFIX, check_group
from popgate_contract.validation import DLQ_RESEND_GROUP as RESEND_GROUP

from .. import errors
from ..client import Producer, SimpleConsumer
from ..message import Message
from .commands import (
    DURATION,
    NON_NEGATIVE_INT,
    POSITIVE_DURATION,
    IdleWait,
    Sub,
    client_options,
    connection,
    error_console,
    explain,
    number,
    print_table,
)

LIST_LIMIT = number(int, low=1, high=1000)

DLQ_PROPS = ("ORIGIN_TOPIC", "ORIGIN_MESSAGE_ID", "DELIVERY_ATTEMPTS", "ORIGIN_QUEUE_ID", "ORIGIN_OFFSET")


# Where `--broker` comes from when not given: POPGATE_BROKERS, else the proxy's own POPGATE_BROKER (set in every
# proxy pod, where docs/DEPLOY.md runs `popgate stats`). Both are lists read as the proxy reads its variable.
BROKER_VARIABLES = ("POPGATE_BROKERS", "POPGATE_BROKER")


def env_brokers() -> list[str]:
    """The ``NAME=HOST:PORT`` entries of the first of BROKER_VARIABLES that is set (comma or space separated)."""
    for variable in BROKER_VARIABLES:
        entries = os.environ.get(variable, "").replace(",", " ").split()
        if entries:
            return entries
    return []


def _broker_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        action="append",
        default=None,
        help="NAME=HOST:PORT of a broker (repeatable; env POPGATE_BROKERS, else the proxy's POPGATE_BROKER:"
        " comma-separated)",
    )
    parser.add_argument(
        "--broker-token",
        default=os.environ.get("POPGATE_BROKER_TOKEN", ""),
        help="the brokers' shared token, when they require one (env POPGATE_BROKER_TOKEN, as the proxy's)",
    )
    parser.set_defaults(default_brokers=env_brokers())


def add_parsers(sub: Sub) -> None:
    stats = sub.add_parser("stats", help="lag per topic and consumer group (asks the brokers)")
    _broker_option(stats)
    stats.add_argument("--topic", default="", help="only this topic")
    stats.add_argument("--group", default="", help="only this group")
    stats.add_argument("--timeout", type=POSITIVE_DURATION, default=3.0, help="per-broker deadline, seconds")
    stats.set_defaults(handler=stats_command)

    dlq = sub.add_parser("dlq", help="dead-lettered messages of a group: list or resend")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="{list,resend}")
    listing = dlq_sub.add_parser(
        "list", help="list the letters of %%DLQ%%<group> not yet re-sent (asks the brokers; consumes nothing)"
    )
    _broker_option(listing)
    listing.add_argument("group", type=_group_name, help="consumer group whose dead letters to list")
    listing.add_argument(
        "--limit", type=LIST_LIMIT, default=100, help="at most this many messages (1..1000, a broker's ListMessages)"
    )
    listing.add_argument("--timeout", type=POSITIVE_DURATION, default=3.0, help="per-broker deadline, seconds")
    listing.add_argument("--all", action="store_true", help="every stored dead letter, also those already re-sent")
    listing.add_argument(
        "--resend-group", default=RESEND_GROUP, help="the group `dlq resend` used: its acked letters are not listed"
    )
    listing.set_defaults(handler=dlq_list_command)
    resend = dlq_sub.add_parser("resend", help="send dead letters back to their original topic (through the proxy)")
    client_options(resend)
    resend.add_argument("group", type=_group_name, help="consumer group whose dead letters to re-send")
    resend.add_argument("--count", type=NON_NEGATIVE_INT, default=0, help="at most this many (0 = all)")
    resend.add_argument("--wait", type=DURATION, default=2.0, help="stop when none came for this many seconds")
    resend.add_argument("--resend-group", default=RESEND_GROUP, help="consumer group that reads the DLQ")
    resend.set_defaults(handler=dlq_resend_command)


@dataclass(frozen=True, slots=True)
class Broker:
    name: str
    target: str
    token: str = ""  # the brokers' shared token (their --auth-token), sent as the proxy sends it

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((TOKEN_KEY, self.token),) if self.token else ()


def brokers_of(args: argparse.Namespace) -> list[Broker]:
    out = []
    for text in args.broker or args.default_brokers:
        name, sep, target = text.partition("=")
        if not sep or ":" not in target:
            raise ValueError(f"--broker {text!r}: expected NAME=HOST:PORT")
        out.append(Broker(name, target, args.broker_token))
    if not out:
        raise ValueError(
            "give at least one --broker NAME=HOST:PORT (as printed by `popgate up`), or set POPGATE_BROKERS"
        )
    return out


def _channel(broker: Broker) -> grpc.Channel:
    # grpc's default 4 MiB receive limit is below what a broker may answer: a ListMessages page is cut at the
    # broker's --max-pop-bytes (8 MiB) but always holds one message, itself up to 4 MiB of body; a Stats answer
    # grows with topics. The broker bounds its answers, so this client takes whatever it is sent.
    return grpc.insecure_channel(broker.target, options=[("grpc.max_receive_message_length", -1)])


def fetch_stats(
    brokers: list[Broker],
    request: bpb.StatsRequest,
    timeout: float,
    *,
    failures: dict[str, grpc.StatusCode] | None = None,
) -> dict[str, bpb.StatsResponse]:
    """Each broker's Stats; those that failed are left out, their status codes put in `failures` when given
    (UNAVAILABLE: not reachable; UNAUTHENTICATED: it wants --broker-token; ...)."""
    out: dict[str, bpb.StatsResponse] = {}
    for broker in brokers:
        with _channel(broker) as channel:
            try:
                stub = bpb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
                out[broker.name] = stub.Stats(request, timeout=timeout, metadata=broker.metadata)
            except grpc.RpcError as exc:
                if failures is not None:
                    failures[broker.name] = exc.code()
    return out


@dataclass
class Lag:
    ready: int = 0
    inflight: int = 0
    lag: int = 0
    oldest_ms: int = 0
    brokers: int = 0


def lag_rows(responses: dict[str, bpb.StatsResponse]) -> dict[tuple[str, str], Lag]:
    """(topic, group) -> lag summed over queues and brokers; the oldest un-acked store time over all."""
    rows: dict[tuple[str, str], Lag] = defaultdict(Lag)
    for response in responses.values():
        seen = set()
        for g in response.groups:
            row = rows[g.topic, g.group]
            row.ready += g.ready
            row.inflight += g.inflight
            row.lag += g.lag
            if g.oldest_unacked_store_ms and (not row.oldest_ms or g.oldest_unacked_store_ms < row.oldest_ms):
                row.oldest_ms = g.oldest_unacked_store_ms
            if (g.topic, g.group) not in seen:
                seen.add((g.topic, g.group))
                row.brokers += 1
    return dict(rows)


def _err(text: str) -> None:
    error_console().print(text)


def _failure(code: grpc.StatusCode) -> str:
    """A broker call's status code, said with what it usually means here."""
    meaning = {
        grpc.StatusCode.UNIMPLEMENTED: " (not a popgate broker: the proxy's address, perhaps?)",
        grpc.StatusCode.UNAUTHENTICATED: " (the broker wants --broker-token)",
    }
    return str(code.name) + meaning.get(code, "")


def _name_column(table: Table, name: str) -> None:
    """A column whose cells (ids, topics, groups) are never cut short: folded in a narrow terminal."""
    table.add_column(name, overflow="fold")


def stats_command(args: argparse.Namespace) -> int:
    brokers = brokers_of(args)
    failures: dict[str, grpc.StatusCode] = {}
    request = bpb.StatsRequest(topic=args.topic, group=args.group)
    responses = fetch_stats(brokers, request, args.timeout, failures=failures)
    for broker in brokers:
        if broker.name in failures:  # as `dlq list`: UNAVAILABLE did not answer, UNAUTHENTICATED refused, ...
            _err(f"popgate stats: broker {broker.name} at {broker.target}: {_failure(failures[broker.name])}")
    if not responses:
        return 1
    now_ms = int(time.time() * 1000)
    table = Table(title=f"lag per topic and group ({len(responses)} of {len(brokers)} brokers)")
    for column in ("topic", "group"):
        _name_column(table, column)
    for column in ("lag", "ready", "inflight", "oldest un-acked", "brokers"):
        table.add_column(column, justify="right", no_wrap=True)  # kept whole: the names fold instead
    rows = lag_rows(responses)
    for (topic, group), row in sorted(rows.items()):
        age = f"{lag_seconds(row.oldest_ms, now_ms):.1f} s" if row.oldest_ms else "-"
        table.add_row(topic, group, str(row.lag), str(row.ready), str(row.inflight), age, str(row.brokers))
    print_table(table)
    topics: dict[str, int] = defaultdict(int)
    for response in responses.values():
        for q in response.queues:
            topics[q.topic] += q.max_offset - q.min_offset
    if args.group:  # only the topics the group reads
        topics = {topic: count for topic, count in topics.items() if any(t == topic for t, _ in rows)}
    summary = Table(title="stored messages")
    _name_column(summary, "topic")
    summary.add_column("messages", justify="right", no_wrap=True)
    for topic, count in sorted(topics.items()):
        summary.add_row(topic, str(count))
    print_table(summary)
    return 0


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
        with _channel(broker) as channel:
            stub = bpb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
            try:
                stats = stub.Stats(bpb.StatsRequest(topic=topic), timeout=timeout, metadata=broker.metadata)
                for queue_id, start, end in _dlq_ranges(stats, topic, resend_group, everything=everything):
                    if len(found.messages) >= limit:
                        break
                    found.messages += _list_queue(
                        stub, broker, topic, queue_id, start, end, limit=limit - len(found.messages), timeout=timeout
                    )
                _count_dead_letters(found, stats, topic, resend_group)
                found.answered += 1
            except grpc.RpcError as exc:
                _err(f"popgate dlq list: broker {broker.name} at {broker.target}: {_failure(exc.code())}")
    return found


def _dlq_title(args: argparse.Namespace, found: DeadLetters, brokers: int) -> str:
    of = f", {found.answered} of {brokers} brokers" if found.answered < brokers else ""
    if args.all:
        return f"{DLQ_PREFIX}{args.group}: {found.stored} message(s) stored ({found.pending} not yet re-sent{of})"
    shown = f"; first {len(found.messages)} listed" if len(found.messages) < found.pending else ""
    return f"{DLQ_PREFIX}{args.group}: {found.pending} message(s) not yet re-sent ({found.stored} stored{shown}{of})"


def _list_queue(
    stub: bpb_grpc.BrokerStub,
    broker: Broker,
    topic: str,
    queue_id: int,
    start: int,
    end: int,
    *,
    limit: int,
    timeout: float,
) -> list[bpb.StoredMessage]:
    """Up to `limit` messages of one queue from `start`, page by page: a broker cuts a page at its byte budget
    (always one message at least), so a short page is not the end; `end` (the queue's max offset) is."""
    out: list[bpb.StoredMessage] = []
    offset = start
    while len(out) < limit and offset < end:
        request = bpb.ListMessagesRequest(
            topic=topic, queue_id=queue_id, from_offset=offset, limit=min(limit - len(out), 1000)
        )
        page = stub.ListMessages(request, timeout=timeout, metadata=broker.metadata).messages
        if not page:
            break
        for stored in page:
            stored.message.body = stored.message.body[:BODY_SHOWN]
        out += page
        offset = page[-1].offset + 1
    return out


def _group_name(text: str) -> str:
    """A consumer group name as brokers take it: a bad one is a usage error for both `dlq` commands (`list`
    showed an empty table for it, `resend` the server's ILLEGAL_TOPIC)."""
    try:
        return check_group(text)
    except DomainError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def dlq_list_command(args: argparse.Namespace) -> int:
    brokers = brokers_of(args)
    found = list_dead_letters(
        brokers, args.group, limit=args.limit, timeout=args.timeout, resend_group=args.resend_group, everything=args.all
    )
    if not found.answered:
        _err(f"popgate dlq list: no broker answered; {DLQ_PREFIX}{args.group} not listed")
        return 1
    table = Table(title=_dlq_title(args, found, len(brokers)))
    if found.resent_listed and not args.all:
        table.caption = (
            f"{found.resent_listed} listed letter(s) were already re-sent, behind one {args.resend_group} has not"
            " acked (the broker does not say which)"
        )
    for column in ("message id", "origin topic"):
        _name_column(table, column)
    for column in ("attempts", "stored"):
        table.add_column(column, no_wrap=True)
    for column in ("tag", "body"):
        table.add_column(column, overflow="fold")
    for s in sorted(found.messages, key=lambda s: s.store_ms):
        m = s.message
        props = m.properties
        stored_at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(s.store_ms / 1000))
        body = m.body.decode(errors="replace")
        tag = m.tag if m.HasField("tag") else ""
        table.add_row(
            props.get("ORIGIN_MESSAGE_ID", m.message_id),
            props.get("ORIGIN_TOPIC", "?"),
            props.get("DELIVERY_ATTEMPTS", "?"),
            stored_at,
            tag,
            body,
        )
    print_table(table)
    return 0


def resent(message: Message) -> tuple[str, Message] | None:
    """The original topic and the message to send there (DLQ bookkeeping properties removed);
    None when the dead letter does not name its original topic (it cannot be re-sent)."""
    origin = message.properties.get("ORIGIN_TOPIC", "")
    if not origin:
        return None
    properties = {k: v for k, v in message.properties.items() if k not in DLQ_PROPS}
    return origin, Message(
        message.body, tag=message.tag, keys=message.keys, properties=properties, message_group=message.message_group
    )


def dlq_resend_command(args: argparse.Namespace) -> int:
    topic = DLQ_PREFIX + args.group
    counts: dict[str, int] = defaultdict(int)
    options = connection(args)
    skipped: dict[str, None] = {}  # ids of dead letters left in the DLQ, in order
    code = 0
    try:
        with (
            SimpleConsumer(args.endpoint, args.resend_group, {topic: "*"}, **options) as consumer,
            Producer(args.endpoint, **options) as producer,
        ):
            idle = IdleWait(args.wait)
            total = 0
            while (args.count == 0 or total < args.count) and (wait := idle.next()) is not None:
                want = 32 if args.count == 0 else min(32, args.count - total)
                batch = consumer.receive(max=want, wait=wait)
                done = []
                for message in batch:
                    plan = resent(message)
                    if plan is None:  # left in the DLQ (not acked): it shows again in `dlq list`
                        skipped.setdefault(message.message_id)  # once, also when it comes back
                        continue
                    producer.send(*plan)
                    counts[plan[0]] += 1
                    done.append(message)
                if done:  # a batch of dead letters left before is not progress: the wait goes on
                    consumer.ack_many(done)
                    idle.received()
                    total += len(done)
    except errors.PopgateError as exc:
        _err(f"popgate dlq resend: {explain(exc)}")
        return 1
    except KeyboardInterrupt:  # the summary of what was re-sent so far, then 130
        code = 130
    where = ", ".join(f"{n} to {t}" for t, n in sorted(counts.items())) or "nothing to resend"
    _err(f"resent {sum(counts.values())} message(s) from {topic}: {where}{' (interrupted)' if code else ''}")
    if skipped:
        ids = ", ".join(skipped)
        _err(f"popgate dlq resend: {len(skipped)} dead letter(s) without ORIGIN_TOPIC left in {topic}: {ids}")
        code = code or 1
    return code
