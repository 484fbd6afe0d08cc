"""Messages on their way to a broker, encoded once as the broker reads them (proto/broker.proto): what
`Proxy.send_runs` routes and a broker Send carries, as bytes.

A `Run` holds messages of one topic and one message group: either each encoded whole as a broker `Message` (a
SendMessage's), or a SendShared run's, whose shared part is encoded once and sent with the bodies and ids as a
`SharedRun` (no protobuf object made per message on the way), which the broker checks and encodes once too —
tests/unit/proxy/test_outgoing.py::test_a_shared_runs_messages_read_as_the_broker_messages_they_stand_for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from popgate_pb import broker_pb2 as bpb

from popgate_contract.wire import field, varint

_MESSAGES, _RUNS, _TIMEOUT = b"\x0a", b"\x12", b"\x18"  # SendRequest.messages (1), runs (2), timeout_ms (3)
_SHARED, _BODIES, _IDS = b"\x0a", b"\x12", b"\x1a"  # SharedRun.shared (1), bodies (2), message_ids (3)
_MESSAGE_ID, _BODY = b"\x1a", b"\x22"  # Message.message_id (3), body (4)
_SEND = b"\x2a"  # SessionRequest.send (5)
FIELD_OVERHEAD = 8  # at most a whole message's field tag and length in a Send, counted with it against a budget
# ... and a shared run's message sent whole: that, its id's and its body's tags and lengths (bodies < 2**28 bytes)
SHARED_OVERHEAD = 16


@dataclass(slots=True)
class Run:
    """Messages to store that share a topic and a message group ("": none), in order, with their message ids
    (named in the answer of a message that was not stored) and the bytes the proxy holds for them, keys and
    properties too (what a send counts against the proxy's bytes in flight). Either `encoded`, each message whole,
    or `shared` (their broker `Message` without body and id, encoded) with each message's body in `bodies`."""

    topic: str
    group: str
    ids: list[str]
    held_bytes: int
    encoded: list[bytes] | None = None
    shared: bytes = b""
    bodies: list[bytes] | None = None

    def sizes(self) -> list[int]:
        """Each message's bytes in a Send, as if it were encoded whole (a budget counts them so)."""
        if self.encoded is not None:
            return [len(data) + FIELD_OVERHEAD for data in self.encoded]
        assert self.bodies is not None
        head = len(self.shared) + SHARED_OVERHEAD
        return [head + len(body) + len(i.encode()) for body, i in zip(self.bodies, self.ids, strict=True)]

    def part(self, start: int, stop: int) -> Run:
        """Its messages start..stop as a run of their own (`held_bytes` 0: a send counts its runs before it cuts
        them into Sends, not again)."""
        encoded, bodies = self.encoded, self.bodies
        return Run(
            self.topic,
            self.group,
            self.ids[start:stop],
            0,
            None if encoded is None else encoded[start:stop],
            self.shared,
            None if bodies is None else bodies[start:stop],
        )


def runs_of(messages: Iterable[bpb.Message]) -> list[Run]:
    """`messages` as runs of messages encoded whole, in order: consecutive messages of one topic and message
    group share one."""
    runs: list[Run] = []
    encoded: list[bytes] = []
    for m in messages:
        topic, group = m.topic, m.message_group
        if not runs or runs[-1].topic != topic or runs[-1].group != group:
            encoded = []
            runs.append(Run(topic, group, [], 0, encoded))
        data = m.SerializeToString()
        encoded.append(data)
        runs[-1].ids.append(m.message_id)
        runs[-1].held_bytes += len(data)
    return runs


def shared_run(template: bpb.Message, bodies: list[bytes], ids: list[str]) -> Run:
    """Messages that are `template` but for their bodies and ids (`template`'s own are not used; all checked
    already)."""
    shared = bpb.Message()
    shared.CopyFrom(template)
    shared.ClearField("message_id")
    shared.ClearField("body")
    data = shared.SerializeToString()
    held = len(data) + sum(len(body) for body in bodies) + sum(len(i) for i in ids)
    return Run(template.topic, template.message_group, ids, held, shared=data, bodies=bodies)


@dataclass(slots=True)
class Chunk:
    """One broker Send: `runs`, all of one kind (messages whole, or shared), each with the place in the client's
    request of its first message; `places`: each message's place, in order; `topic`: theirs, None when several."""

    runs: list[tuple[int, Run]]
    places: list[int]
    topic: str | None

    def request(self, *, runs: bool, timeout_ms: int = 0) -> list[bytes]:
        """The SessionRequest field `send` of this Send, in parts to join (the session adds the request's id).
        `runs`: the broker stores a Send's runs (it said so when its stream opened); else each shared run's
        messages go whole, as a broker that does not know runs reads them. `timeout_ms`: the broker's time for it
        (SendRequest.timeout_ms; 0: none)."""
        parts: list[bytes] = [_TIMEOUT, varint(timeout_ms)] if timeout_ms else []
        for _, run in self.runs:
            if run.encoded is not None:
                for data in run.encoded:
                    parts += (_MESSAGES, varint(len(data)), data)
                continue
            assert run.bodies is not None
            if runs:
                entries = [field(_SHARED, run.shared), *(field(_BODIES, body) for body in run.bodies)]
                entries += (field(_IDS, message_id.encode()) for message_id in run.ids)
                parts += (_RUNS, varint(sum(map(len, entries))), *entries)
                continue
            for body, message_id in zip(run.bodies, run.ids, strict=True):
                data = message_id.encode()
                whole = (run.shared, _MESSAGE_ID, varint(len(data)), data, _BODY, varint(len(body)), body)
                parts += (_MESSAGES, varint(sum(map(len, whole))), *whole)
        return [_SEND, varint(sum(map(len, parts))), *parts]


def chunks(placed: Sequence[tuple[int, Run]], budget: int) -> list[Chunk]:
    """Split a batch (runs, each with the request's place of its first message) into broker Sends, in order, of at
    most `budget` encoded bytes (at least one message each), each of runs of one kind: a broker stores a Send's
    whole messages before its runs, so a Send of both kinds would store them out of the request's order.

    A broker's gRPC message size limit is finite, and one frame over it resets the whole Session
    stream (every request on it fails): a client batch of many large messages must not exceed it in
    one call. Encoded sizes, not bodies: properties count too —
    tests/unit/proxy/test_core.py::test_the_budget_counts_properties_not_only_bodies. A shared run's messages
    count as if whole, which is what they are at a broker that does not read runs.
    """
    parts: list[list[tuple[int, Run]]] = [[]]
    size = 0
    for start, run in placed:
        if parts[-1] and (parts[-1][-1][1].encoded is None) != (run.encoded is None):
            parts.append([])
            size = 0
        first = 0
        for i, n in enumerate(run.sizes()):
            if size + n > budget and (parts[-1] or i > first):
                if i > first:
                    parts[-1].append((start + first, run.part(first, i)))
                parts.append([])
                size, first = 0, i
            size += n
        parts[-1].append((start + first, run if first == 0 else run.part(first, len(run.ids))))
    return [_chunk(part) for part in parts]


def _chunk(runs: list[tuple[int, Run]]) -> Chunk:
    topics = {run.topic for _, run in runs}
    places = [p for start, run in runs for p in range(start, start + len(run.ids))]
    return Chunk(runs, places, topics.pop() if len(topics) == 1 else None)
