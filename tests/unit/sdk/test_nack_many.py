"""The sans-IO bookkeeping of a `nack_many` (`popgate._nacks`): its requests, each message's new handle as its
entry is answered, retriable entries sent again alone, a re-sent entry answered stale taken for outcome unknown."""

from __future__ import annotations

import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Message, _nacks, _resend, errors


def received(i: int, topic: str = "t") -> Message:
    return Message(b"x", topic=topic, message_id=f"m{i}", receipt_handle=f"h{i}")


def entry(message_id: str, code: int, handle: str = "") -> pb.AckMessageResultEntry:
    return pb.AckMessageResultEntry(message_id=message_id, receipt_handle=handle, status=v2.Status(code=code))


def test_a_plan_has_a_request_per_topic_and_1024_messages_with_each_message_in_order() -> None:
    messages = [received(i, "b" if i % 3 == 2 else "a") for i in range(2100)]
    plan = _nacks.plan("g", messages, 2.5, namespace="ns")
    requests = [p.next_request() for p in plan]
    assert [(r.topic.name, len(r.entries)) for r in requests] == [("a", 1024), ("a", 376), ("b", 700)]
    first = requests[0]
    assert (first.group.name, first.group.resource_namespace, first.invisible_duration.seconds) == ("g", "ns", 2)
    assert first.invisible_duration.nanos == 500_000_000
    assert [e.message_id for e in first.entries[:3]] == ["m0", "m1", "m3"]


@pytest.mark.parametrize("bad", [Message(b"x", topic="t"), Message(b"x", receipt_handle="h")])
def test_a_message_never_received_is_refused_before_anything_is_sent(bad: Message) -> None:
    with pytest.raises(ValueError, match="only a received message can be nacked"):
        _nacks.plan("g", [received(1), bad], 0)


def test_changed_messages_get_their_new_handle_and_retriable_failures_go_again_alone() -> None:
    messages = [received(i) for i in range(3)]
    [pending] = _nacks.plan("g", messages, 0)
    pending.next_request()
    answer = ext.ChangeInvisibleManyResponse(
        status=v2.Status(code=v2.MULTIPLE_RESULTS),
        entries=[entry("m0", v2.OK, "new0"), entry("m1", v2.HA_NOT_AVAILABLE), entry("m2", v2.BAD_REQUEST)],
    )
    with pytest.raises(_resend.ResendEntries):
        pending.read(_nacks.outcome_of(answer, 3))
    assert [m.receipt_handle for m in messages] == ["new0", "h1", "h2"]
    assert [e.message_id for e in pending.next_request().entries] == ["m1"]
    stale = ext.ChangeInvisibleManyResponse(
        status=v2.Status(code=v2.INVALID_RECEIPT_HANDLE), entries=[entry("m1", v2.INVALID_RECEIPT_HANDLE)]
    )
    failures = pending.read(_nacks.outcome_of(stale, 1))  # answered unavailable: maybe changed by the first attempt
    assert [(message_id, type(e), e.retriable) for message_id, e in failures] == [
        ("m2", errors.BadRequest, False),
        ("m1", errors.Timeout, False),
    ]
    assert "nack outcome unknown" in failures[1][1].message


def test_a_stale_handle_at_the_first_attempt_is_an_invalid_handle_not_outcome_unknown() -> None:
    [pending] = _nacks.plan("g", [received(0)], 0)
    pending.next_request()
    answer = ext.ChangeInvisibleManyResponse(
        status=v2.Status(code=v2.INVALID_RECEIPT_HANDLE), entries=[entry("m0", v2.INVALID_RECEIPT_HANDLE)]
    )
    [(_, error)] = pending.read(_nacks.outcome_of(answer, 1))
    assert isinstance(error, errors.InvalidReceiptHandle)


def test_a_whole_request_refused_is_raised_and_given_up_for_every_message_left() -> None:
    [pending] = _nacks.plan("g", [received(0), received(1)], 0)
    pending.next_request()
    refused = ext.ChangeInvisibleManyResponse(status=v2.Status(code=v2.FORBIDDEN, message="no"))
    with pytest.raises(errors.Unauthorized) as raised:
        _nacks.outcome_of(refused, 2)
    failures = pending.given_up(raised.value)
    assert [(message_id, e) for message_id, e in failures] == [("m0", raised.value), ("m1", raised.value)]


def test_entries_still_failing_retriably_at_the_end_are_reported_with_their_own_error() -> None:
    [pending] = _nacks.plan("g", [received(0), received(1)], 0)
    pending.next_request()
    answer = ext.ChangeInvisibleManyResponse(
        status=v2.Status(code=v2.MULTIPLE_RESULTS),
        entries=[entry("m0", v2.OK, "new0"), entry("m1", v2.TOO_MANY_REQUESTS)],
    )
    with pytest.raises(_resend.ResendEntries) as raised:
        pending.read(_nacks.outcome_of(answer, 2))
    [(message_id, error)] = pending.given_up(raised.value)
    assert (message_id, type(error)) == ("m1", errors.TooManyRequests)


def test_an_answer_with_entries_missing_is_a_server_error() -> None:
    answer = ext.ChangeInvisibleManyResponse(status=v2.Status(code=v2.OK), entries=[entry("m0", v2.OK, "n")])
    with pytest.raises(errors.ServerError, match="answered 1 entries for 2"):
        _nacks.outcome_of(answer, 2)


def test_a_nack_error_counts_the_outcomes_unknown() -> None:
    unknown = errors.Timeout(_resend.NACK_OUTCOME_UNKNOWN, retriable=False)
    error = errors.NackError([("a", errors.InvalidReceiptHandle("stale")), ("b", unknown)])
    assert error.outcome_unknown == ["b"] and not error.retriable
    assert str(error).startswith("2 message(s) not nacked or not known to be (1 outcome unknown)")


def test_a_request_the_proxy_did_not_serve_counts_as_no_attempt() -> None:
    """A proxy without ChangeInvisibleMany: the ChangeInvisibleDuration of each message that follows is its first
    attempt, so a stale handle is InvalidReceiptHandle, not outcome unknown."""
    [pending] = _nacks.plan("g", [received(0)], 0)
    pending.next_request()
    [single] = pending.single_requests()
    assert (single.receipt_handle, single.message_id, single.group.name) == ("h0", "m0", "g")
    [(_, error)] = pending.read([errors.InvalidReceiptHandle("stale")])
    assert type(error) is errors.InvalidReceiptHandle


def test_a_timed_out_attempt_makes_what_fails_after_it_outcome_unknown() -> None:
    """The first attempt timed out (it may have changed the handles); the second is refused for one message and
    never answered for the other: neither is reported as surely not nacked."""
    [pending] = _nacks.plan("g", [received(0), received(1)], 0)
    pending.next_request()
    pending.attempt_failed(errors.Timeout("deadline exceeded"))
    pending.next_request()
    answer = ext.ChangeInvisibleManyResponse(
        status=v2.Status(code=v2.MULTIPLE_RESULTS),
        entries=[entry("m0", v2.BAD_REQUEST), entry("m1", v2.TOO_MANY_REQUESTS)],
    )
    with pytest.raises(_resend.ResendEntries) as raised:
        pending.read(_nacks.outcome_of(answer, 2))
    failures = pending.given_up(raised.value)
    assert [(message_id, type(e), e.retriable) for message_id, e in failures] == [
        ("m0", errors.Timeout, False),
        ("m1", errors.Timeout, False),
    ]
    assert "may have reached the broker" in failures[0][1].message
    assert errors.NackError(failures).outcome_unknown == ["m0", "m1"]


def test_a_call_that_never_connected_leaves_the_outcome_known() -> None:
    [pending] = _nacks.plan("g", [received(0)], 0)
    pending.next_request()
    never = errors.Unavailable(f"{_resend.NEVER_CONNECTED}: 127.0.0.1:1")
    pending.attempt_failed(never)
    [(_, error)] = pending.given_up(never)
    assert error is never and errors.NackError([("m0", error)]).outcome_unknown == []


def test_a_message_given_twice_is_changed_once_and_both_copies_get_the_new_handle() -> None:
    first, again, other = received(0), received(0), received(1)
    [pending] = _nacks.plan("g", [first, other, first, again], 0)
    request = pending.next_request()
    assert [e.receipt_handle for e in request.entries] == ["h0", "h1"]
    answer = ext.ChangeInvisibleManyResponse(
        status=v2.Status(code=v2.OK), entries=[entry("m0", v2.OK, "new0"), entry("m1", v2.OK, "new1")]
    )
    assert pending.read(_nacks.outcome_of(answer, 2)) == []
    assert [m.receipt_handle for m in (first, again, other)] == ["new0", "new0", "new1"]


def test_a_handle_given_twice_far_apart_is_sent_in_one_request_only() -> None:
    messages = [received(i) for i in range(1100)]
    again = received(5)
    plan = _nacks.plan("g", [*messages, again], 0)
    requests = [p.next_request() for p in plan]
    assert [len(r.entries) for r in requests] == [1024, 76]
    assert [e.receipt_handle for r in requests for e in r.entries].count("h5") == 1
    answer = ext.ChangeInvisibleManyResponse(
        status=v2.Status(code=v2.OK),
        entries=[entry(e.message_id, v2.OK, "new" + e.message_id) for e in requests[0].entries],
    )
    assert plan[0].read(_nacks.outcome_of(answer, 1024)) == []
    assert (messages[5].receipt_handle, again.receipt_handle) == ("newm5", "newm5")


def test_a_stale_handle_after_a_refusal_that_changed_nothing_is_an_invalid_handle() -> None:
    """Sent again after TOO_MANY_REQUESTS (a refusal that changed nothing): a stale handle then is the message's own
    redelivery, not this call's doing."""
    [pending] = _nacks.plan("g", [received(0)], 0)
    pending.next_request()
    busy = ext.ChangeInvisibleManyResponse(
        status=v2.Status(code=v2.MULTIPLE_RESULTS), entries=[entry("m0", v2.TOO_MANY_REQUESTS)]
    )
    with pytest.raises(_resend.ResendEntries):
        pending.read(_nacks.outcome_of(busy, 1))
    pending.next_request()
    stale = ext.ChangeInvisibleManyResponse(
        status=v2.Status(code=v2.INVALID_RECEIPT_HANDLE), entries=[entry("m0", v2.INVALID_RECEIPT_HANDLE)]
    )
    [(_, error)] = pending.read(_nacks.outcome_of(stale, 1))
    assert type(error) is errors.InvalidReceiptHandle
