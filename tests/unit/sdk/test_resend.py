"""The sans-IO bookkeeping of an AckMessage through its attempts (`popgate._resend`)."""

from __future__ import annotations

import grpc
import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Producer, _resend, errors
from popgate.retry import RetryPolicy
from tests.unit.sdk.fakes import FakeRpcError


def test_resent_entries_are_found_by_message_id_when_the_answer_does_not_echo_handles() -> None:
    request = pb.AckMessageRequest(
        entries=[pb.AckMessageEntry(message_id=i, receipt_handle=f"h-{i}") for i in ("a", "b", "c")]
    )
    pending = _resend.PendingAck(request)
    pending.next_request()
    answer = pb.AckMessageResponse(
        status=v2.Status(code=v2.MULTIPLE_RESULTS),
        entries=[
            pb.AckMessageResultEntry(message_id="a", status=v2.Status(code=v2.OK)),
            pb.AckMessageResultEntry(message_id="b", status=v2.Status(code=v2.INVALID_RECEIPT_HANDLE)),
            pb.AckMessageResultEntry(message_id="c", status=v2.Status(code=v2.HA_NOT_AVAILABLE)),
        ],
    )
    with pytest.raises(_resend.ResendEntries):
        pending.read(answer)
    assert [(e.message_id, e.receipt_handle) for e in pending.next_request().entries] == [("c", "h-c")]
    ok = pb.AckMessageResponse(status=v2.Status(code=v2.OK))
    assert [(message_id, type(e)) for message_id, e in pending.read(ok)] == [("b", errors.InvalidReceiptHandle)]


def test_a_recall_resent_after_a_lost_answer_is_outcome_unknown_not_not_found() -> None:
    """The first RecallMessage withdraws the scheduled message and its answer is lost (a deadline): the retry finds
    it gone. That is not the NotFound that says it was delivered: `Timeout`, not retriable, outcome unknown."""

    class Stub:
        waiting = {"RH"}
        calls = 0

        def RecallMessage(self, request: pb.RecallMessageRequest, **_: object) -> pb.RecallMessageResponse:  # noqa: N802
            self.calls += 1
            if request.recall_handle in self.waiting:
                self.waiting.discard(request.recall_handle)  # withdrawn: never delivered
                raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED)  # and the answer lost
            return pb.RecallMessageResponse(status=v2.Status(code=v2.NOT_FOUND, message="delivered or recalled"))

    producer = Producer("127.0.0.1:1", retry=RetryPolicy(initial_backoff=0.01, max_backoff=0.01))
    stub = producer._stub = Stub()  # type: ignore[assignment]  # noqa: SLF001
    try:
        with pytest.raises(errors.Timeout, match="recall outcome unknown") as unknown:
            producer.recall("t", "RH")
        assert not unknown.value.retriable and stub.calls == 2
        with pytest.raises(errors.NotFound):  # asked once, it is gone: NotFound as ever
            producer.recall("t", "RH")
    finally:
        producer.close()
