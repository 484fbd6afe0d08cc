"""Requests of concurrent callers joined into one (sans-IO): what the Session writer finds queued together.

Sends to one topic queued together become one SendMessage (or one SendShared of their runs), and acks of one
topic and group one AckMessage; each caller gets its own part of the answer, as if its request had gone alone. A
serialized protobuf message followed by another reads as one message whose repeated fields hold both
(SendMessageRequest's `messages`, SendShared's `runs`, AckMessageRequest's `entries`; the group and topic of joined
acks are the same), so joining is a concatenation of bodies.

Receives alike in every field (the same bytes: group, topic, filter, batch, invisible and polling time) queued
together become one receive of their batches added up, where the proxy said it takes such (its Session's
`popgate-receive-batch` header), up to `MAX_JOINED_RECEIVE` messages: one request, one broker Pop, one answer for
them all. Its FIFO messages all go to one part, the others are shared out evenly in the parts' order
(`split_received`); a part left without any (fewer messages came than parts, or only FIFO messages came) is
`CUT_SHORT` and its caller receives again for the rest of its wait.

The proxy answers a joined request per message or entry, so each part's answer is its slice, with the status of its
first failed entry (OK when none failed) — tests/unit/sdk/test_joining.py. A joined request refused as a whole as
a bad request (no entries, a 4xx that is not retriable: say a message the proxy refuses) is sent again part by
part, so that each caller gets the answer to its own request and no caller fails for another's message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract.wire import varint

from . import _wire, errors

JOINED_KINDS = frozenset({"send", "send_shared", "ack", "receive"})
# The proxy's bound on a SendMessage's messages and on an AckMessage's entries (proxy/v2/send.py, proxy/v2/ack.py).
MAX_ENTRIES = 1024
# The most messages one joined receive asks: two receives of 32. Larger lots leave client, proxy and broker waiting
# on each other in turn (docs/BENCHMARKS.md, "What bounds the figures").
MAX_JOINED_RECEIVE = 64
_OK = v2.Status(code=v2.OK, message="OK")
_BATCH_SIZE = b"\x20"  # ReceiveMessageRequest.batch_size (4, varint): appended, it replaces the one before


@dataclass(slots=True)
class Part:
    """One caller's request, serialized, waiting in the writer's queue to go alone or joined."""

    request_id: int
    kind: str
    key: tuple[str | bytes, ...]  # parts of one key may be joined
    body: bytes
    count: int  # its messages or entries (a receive's: its batch)
    timeout_ms: int
    most: int = MAX_ENTRIES  # the most messages or entries of a request joining parts of this key


def part(request_id: int, kind: str, request: Any, body: bytes, timeout_ms: int, receive_batch: int = 0) -> Part:
    """`request` (serialized: `body`) as a part to join; a receive's joined request asks `receive_batch` messages at
    most (the proxy's word: 0 joins none)."""
    if kind == "receive":
        most = min(receive_batch, MAX_JOINED_RECEIVE)
        return Part(request_id, kind, (kind, body), body, request.batch_size, timeout_ms, most)
    if kind == "send_shared":  # as a send: with those to the same topic only
        topic = request.shared.topic
        key: tuple[str, ...] = (kind, topic.resource_namespace, topic.name)
        return Part(request_id, kind, key, body, len(request.message_ids), timeout_ms)
    if kind == "send":  # a send_many's requests name one topic: joined with sends to the same topic only, so that
        # the proxy's per-topic routing (a topic missing on a broker) serves a joined request as each alone
        messages = request.messages
        topic = messages[0].topic if messages else None
        key = ("send",) if topic is None else ("send", topic.resource_namespace, topic.name)
        return Part(request_id, kind, key, body, len(messages), timeout_ms)
    group, topic = request.group, request.topic
    key = ("ack", group.resource_namespace, group.name, topic.resource_namespace, topic.name)
    return Part(request_id, kind, key, body, len(request.entries), timeout_ms)


def groups(items: Sequence[bytes | Part]) -> list[bytes | list[Part]]:
    """`items` in their order, the parts of one key gathered at the place of the first (up to MAX_ENTRIES entries a
    group; the rest starts another)."""
    out: list[bytes | list[Part]] = []
    open_groups: dict[tuple[str | bytes, ...], list[Part]] = {}
    for item in items:
        if isinstance(item, bytes):
            out.append(item)
            continue
        group = open_groups.get(item.key)
        if group is None or sum(p.count for p in group) + item.count > item.most:
            group = open_groups[item.key] = []
            out.append(group)
        group.append(item)
    return out


def joined_max_fifo(parts: Sequence[Part]) -> int:
    """What a request joining `parts` asks of FIFO messages at most: one receive's worth (`split_received` gives
    them all to one caller); 0 for other kinds."""
    return parts[0].count if parts[0].kind == "receive" else 0


def joined_body(parts: Sequence[Part]) -> bytes:
    """The body of the request joining `parts`: their bodies one after another, or for receives (alike but for
    nothing) the first with the batches added up."""
    if parts[0].kind == "receive":
        return parts[0].body + _BATCH_SIZE + varint(sum(p.count for p in parts))
    return b"".join(p.body for p in parts)


class _CutShort(tuple[()]):
    """The answer of a joined receive's part that got none of its messages (fewer came than parts, or only FIFO
    ones, all given to another part)."""


CUT_SHORT = _CutShort()


@dataclass(frozen=True, slots=True)
class _Messages:
    messages: Sequence[v2.Message]


@dataclass(frozen=True, slots=True)
class Share:
    """A part's messages of a joined receive, read as a ReceiveMessagesResponse's messages frame is (by
    `_wire.received`, and by a give-back of messages nobody waits for), without copying them into one."""

    messages: _Messages

    @classmethod
    def of(cls, messages: Sequence[v2.Message]) -> Share:
        return cls(_Messages(messages))

    def WhichOneof(self, _oneof: str) -> str:  # noqa: N802 (protobuf's name, read in its place)
        return "messages"


def split_received(frames: Sequence[Any], counts: Sequence[int]) -> tuple[list[Any], list[v2.Message]]:
    """Each part's answer to a joined receive answered with `frames` (its messages frames, then its status), the
    parts asking `counts` messages each, and the messages left over (for parts that stopped waiting: to give back).
    Every FIFO message (one with a message group) goes to the first part, in order, so that no message group's run
    is split between callers: the joined receive asked the proxy for at most one receive's worth of them
    (`max_fifo`). The others are shared out evenly in order, a part getting at most its count. With no message
    at all (an empty poll, an error) each part gets `frames` — tests/unit/sdk/test_joined_receives.py."""
    messages = [m for f in frames[:-1] if f.WhichOneof("content") == "messages" for m in f.messages.messages]
    if not messages or not counts:
        return [frames] * len(counts), messages
    status = frames[-1]
    shares: list[list[v2.Message]] = [[] for _ in counts]
    fifo = [m for m in messages if m.system_properties.message_group]
    plain = [m for m in messages if not m.system_properties.message_group] if fifo else messages
    shares[0] += fifo[: counts[0]]
    left = fifo[counts[0] :]  # more than one receive's worth: a broker that does not bound them
    start, parts, placed = 0, len(counts), 0  # placed: the messages of the parts before this one
    unplaced = len(plain) + len(shares[0])
    for i, count in enumerate(counts):
        fair = -(-(unplaced - placed) // (parts - i))  # an even share of what the parts before left, rounded up
        take = max(0, min(count, fair) - len(shares[i]))
        shares[i] += plain[start : start + take]
        start += take
        placed += len(shares[i])
    answers = [[Share.of(share), status] if share else CUT_SHORT for share in shares]
    return answers, left + plain[start:]


def refused_whole(answer: Any, parts: Sequence[Part]) -> bool:
    """Whether a joined request's answer refuses it as a whole, as a bad request (a v2 4xx code that is not
    retriable: refused before anything was stored, since a request stored in part is answered per entry): its parts
    are then sent again one by one, and each caller gets its own request's answer. A server's failure (5xx) is
    every caller's answer, as it would be had each request gone alone."""
    status = answer.status
    if status.code in _wire.SUCCESS or len(answer.entries) == sum(p.count for p in parts):
        return False
    return 40000 <= status.code < 50000 and not errors.error_for(status.code, status.message).retriable


@dataclass(slots=True)
class PartAnswer:
    """One caller's part of a send answered OK: the status and its slice of the entries (read by
    `_wire.send_receipts` as the answer itself)."""

    status: v2.Status
    entries: Sequence[pb.SendResultEntry]


def split(answer: Any, counts: Sequence[int]) -> list[Any]:
    """Each part's answer: its slice of the entries, OK unless one of them failed (then that entry's status).
    Without entries (the whole request failed, not as a bad request: `refused_whole`), every part gets the same
    answer; so does every part of an ack answered OK, whose entries nobody reads."""
    entries = answer.entries
    all_ok = answer.status.code == v2.OK
    if len(entries) != sum(counts) or (all_ok and isinstance(answer, pb.AckMessageResponse)):
        return [answer] * len(counts)
    if all_ok:  # a send: each part its slice, no entry copied
        taken = entries[:]
        parts: list[Any] = []
        start = 0
        for count in counts:
            parts.append(PartAnswer(answer.status, taken[start : start + count]))
            start += count
        return parts
    kind = type(answer)
    out = []
    start = 0
    for count in counts:
        mine = entries[start : start + count]
        start += count
        failed = next((e.status for e in mine if _failed(e)), None)
        response = kind(status=_OK if failed is None else failed)
        response.entries.extend(mine)
        out.append(response)
    return out


def _failed(entry: Any) -> bool:
    return bool(entry.HasField("status") and entry.status.code not in _wire.SUCCESS)
