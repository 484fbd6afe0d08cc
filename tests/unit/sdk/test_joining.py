"""Requests of concurrent callers joined into one on the SDK's Session stream (sdk/_joining.py, sdk/_session.py),
without a stream: what the writer sends for what is queued, and how each caller's part of the answer reaches it."""

from __future__ import annotations

import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import _frames, _ids, _joining, _waiting, _wire
from tests.unit.sdk.fakes import Callers

OK = v2.Status(code=v2.OK, message="OK")


def send(*bodies: bytes) -> pb.SendMessageRequest:
    return pb.SendMessageRequest(messages=[v2.Message(topic=v2.Resource(name="t"), body=b) for b in bodies])


def ack(group: str, *handles: str) -> pb.AckMessageRequest:
    entries = [pb.AckMessageEntry(message_id=f"id-{h}", receipt_handle=h) for h in handles]
    return pb.AckMessageRequest(group=v2.Resource(name=group), topic=v2.Resource(name="t"), entries=entries)


async def test_sends_queued_together_go_as_one_request_and_each_caller_gets_its_own_receipts() -> None:
    callers = Callers()
    a, b = callers.request("send", send(b"a1", b"a2")), callers.request("send", send(b"b1"))
    (joined,) = callers.written()
    assert joined.id not in (a, b) and [m.body for m in joined.send.messages] == [b"a1", b"a2", b"b1"]
    entries = [pb.SendResultEntry(status=OK, message_id=f"m{i}", offset=i) for i in range(3)]
    callers.waiting.answer(ext.SessionResponse(id=joined.id, send=pb.SendMessageResponse(status=OK, entries=entries)))
    got_a, got_b = callers.futures[a].result(), callers.futures[b].result()
    assert [e.message_id for e in got_a.entries] == ["m0", "m1"] and got_a.status.code == v2.OK
    assert [e.message_id for e in got_b.entries] == ["m2"] and len(callers.waiting) == 0


async def test_acks_are_joined_per_topic_and_group_and_other_requests_keep_their_place() -> None:
    callers = Callers()
    g1 = callers.request("ack", ack("g1", "h1"))
    other = callers.request("change_invisible", pb.ChangeInvisibleDurationRequest(receipt_handle="h9"))
    g2 = callers.request("ack", ack("g2", "h2"))
    g1_again = callers.request("ack", ack("g1", "h3"))
    written = callers.written()
    assert [r.WhichOneof("body") for r in written] == ["ack", "change_invisible", "ack"]
    assert [e.receipt_handle for e in written[0].ack.entries] == ["h1", "h3"] and written[0].ack.group.name == "g1"
    assert (written[1].id, written[2].id) == (other, g2)
    callers.waiting.answer(ext.SessionResponse(id=written[0].id, ack=pb.AckMessageResponse(status=OK)))
    assert callers.futures[g1].result().status.code == callers.futures[g1_again].result().status.code == v2.OK


async def test_a_failed_entry_fails_only_the_caller_whose_message_it_is() -> None:
    callers = Callers()
    a, b = callers.request("send", send(b"a")), callers.request("send", send(b"b"))
    (joined,) = callers.written()
    busy = v2.Status(code=v2.TOO_MANY_REQUESTS, message="broker b2 is busy")
    entries = [pb.SendResultEntry(status=OK, message_id="m0"), pb.SendResultEntry(status=busy)]
    response = pb.SendMessageResponse(status=busy, entries=entries)
    callers.waiting.answer(ext.SessionResponse(id=joined.id, send=response))
    assert callers.futures[a].result().status.code == v2.OK
    assert callers.futures[b].result().status == busy


async def test_a_joined_request_refused_whole_is_sent_again_part_by_part() -> None:
    callers = Callers()
    a, b = callers.request("send", send(b"a")), callers.request("send", send(b"b"))
    (joined,) = callers.written()
    refused = pb.SendMessageResponse(status=v2.Status(code=v2.ILLEGAL_DELIVERY_TIME, message="too late"))
    again = callers.waiting.answer(ext.SessionResponse(id=joined.id, send=refused))
    assert [p.request_id for p in again] == [a, b] and not any(f.done() for f in callers.futures.values())
    resent = [ext.SessionRequest.FromString(_frames.encode(p.request_id, p.kind, p.body, p.timeout_ms)) for p in again]
    assert [(r.id, [m.body for m in r.send.messages]) for r in resent] == [(a, [b"a"]), (b, [b"b"])]


async def test_sends_to_other_topics_are_not_joined() -> None:
    callers = Callers()
    other = pb.SendMessageRequest(messages=[v2.Message(topic=v2.Resource(name="u"), body=b"u")])
    a, b, c = callers.request("send", send(b"t1")), callers.request("send", other), callers.request("send", send(b"t2"))
    written = callers.written()
    assert [[m.body for m in r.send.messages] for r in written] == [[b"t1", b"t2"], [b"u"]]
    assert written[1].id == b and written[0].id not in (a, c)


async def test_a_joined_request_failed_by_the_server_answers_each_caller_alike() -> None:
    # A 5xx without entries is each caller's answer, as it would be alone: it is not sent again part by part (some
    # of it may be stored).
    callers = Callers()
    a, b = callers.request("send", send(b"a")), callers.request("send", send(b"b"))
    (joined,) = callers.written()
    failed = pb.SendMessageResponse(status=v2.Status(code=v2.INTERNAL_SERVER_ERROR, message="internal error"))
    assert callers.waiting.answer(ext.SessionResponse(id=joined.id, send=failed)) == []
    assert callers.futures[a].result() == callers.futures[b].result() == failed


async def test_a_joined_request_failed_whole_retriably_answers_each_caller_alike() -> None:
    callers = Callers()
    a, b = callers.request("ack", ack("g", "h1")), callers.request("ack", ack("g", "h2"))
    (joined,) = callers.written()
    busy = pb.AckMessageResponse(status=v2.Status(code=v2.TOO_MANY_REQUESTS, message="busy"))
    assert callers.waiting.answer(ext.SessionResponse(id=joined.id, ack=busy)) == []
    assert callers.futures[a].result() == callers.futures[b].result() == busy


async def test_a_part_dropped_unwritten_is_not_sent_and_a_joined_request_is_cancelled_with_its_last_part() -> None:
    callers = Callers()
    gone = callers.request("send", send(b"gone"))
    callers.waiting.drop(gone)
    assert callers.waiting.to_cancel(gone) == gone
    a, b = callers.request("send", send(b"a")), callers.request("send", send(b"b"))
    assert [[m.body for m in r.send.messages] for r in callers.written()] == [[b"a", b"b"]]
    callers.waiting.drop(a)
    assert callers.waiting.to_cancel(a) is None  # b still waits for the joined request's answer
    callers.waiting.drop(b)
    assert callers.waiting.to_cancel(b) not in (None, a, b)  # the joined request's own id


async def test_a_joined_request_holds_at_most_the_proxys_entries_per_request() -> None:
    callers = Callers()
    for _ in range(3):
        callers.request("ack", ack("g", *(f"h{i}" for i in range(400))))
    assert [len(r.ack.entries) for r in callers.written()] == [800, 400]
    assert _joining.MAX_ENTRIES == 1024


def shared_send(topic: str, *bodies: bytes, tag: str | None = None) -> _wire.SharedSend:
    return _wire.shared_sends(topic, list(bodies), _wire.outgoing(b"", tag=tag), _ids.MessageIds())[0]


async def test_shared_sends_to_one_topic_go_as_one_request_of_their_runs() -> None:
    """Runs of different options (a tag, another born time) join as runs of one SendShared; another topic's and a v2
    send do not join them. Each caller gets its own entries, answered in the `send` field."""
    callers = Callers()
    first, tagged = shared_send("t", b"a1", b"a2"), shared_send("t", b"b1", tag="x")
    a, b = callers.request("send_shared", first), callers.request("send_shared", tagged)
    other, plain = callers.request("send_shared", shared_send("u", b"c1")), callers.request("send", send(b"d1"))
    joined, alone, v2_send = callers.written()
    assert [(r.shared, list(r.bodies)) for r in joined.send_shared.runs] == [
        (first.shared, [b"a1", b"a2"]),
        (tagged.shared, [b"b1"]),
    ]
    assert (alone.id, [r.shared.topic.name for r in alone.send_shared.runs], v2_send.id) == (other, ["u"], plain)
    entries = [pb.SendResultEntry(status=OK, message_id=f"m{i}", offset=i) for i in range(3)]
    callers.waiting.answer(ext.SessionResponse(id=joined.id, send=pb.SendMessageResponse(status=OK, entries=entries)))
    assert [_wire.send_receipts("t", first, callers.futures[a].result())[i].offset for i in (0, 1)] == [0, 1]
    assert [r.message_id for r in _wire.send_receipts("t", tagged, callers.futures[b].result())] == ["m2"]


async def test_a_shared_send_a_proxy_does_not_know_fails_as_kind_unknown() -> None:
    """A proxy older than SendShared refuses it as a request without a body (a bare BAD_REQUEST status): the caller
    gets KindUnknown, and the Producer sends its messages again as a SendMessage."""
    callers = Callers()
    request_id = callers.request("send_shared", shared_send("t", b"a"))
    callers.written()
    status = v2.Status(code=v2.BAD_REQUEST, message="session: a request without a body")
    callers.waiting.answer(ext.SessionResponse(id=request_id, status=status))
    with pytest.raises(_waiting.KindUnknown):
        callers.futures[request_id].result()
    assert len(callers.waiting) == 0
