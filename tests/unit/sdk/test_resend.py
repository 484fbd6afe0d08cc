"""The sans-IO bookkeeping of an AckMessage through its attempts (`popgate._resend`)."""

from __future__ import annotations

import grpc
import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Producer, SendReceipt, _resend, aio, errors
from popgate.retry import RetryPolicy
from tests.unit.sdk.fakes import FakeChannel, FakeRpcError


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


class LostCommitStub:
    """EndTransaction as a broker that applies the first attempt (its answer lost to a deadline) and then, having
    forgotten that resolution (restarted, or 4,096 others since), answers INVALID_TRANSACTION_ID."""

    def __init__(self) -> None:
        self.calls = 0

    def EndTransaction(self, request: pb.EndTransactionRequest, **_: object) -> pb.EndTransactionResponse:  # noqa: N802
        self.calls += 1
        if self.calls == 1 and request.message_id == "lost":
            raise FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED)
        message = "no half message for that transaction id (resolved or expired)"
        return pb.EndTransactionResponse(status=v2.Status(code=v2.INVALID_TRANSACTION_ID, message=message))


def test_a_commit_resent_after_a_lost_answer_and_refused_is_outcome_unknown_not_not_committed() -> None:
    producer = Producer("127.0.0.1:1", retry=RetryPolicy(initial_backoff=0.01, max_backoff=0.01))
    stub = producer._stub = LostCommitStub()  # type: ignore[assignment]  # noqa: SLF001
    try:
        tx = producer.transaction()
        tx._sent("t", SendReceipt("lost", "t", 0, transaction_id="tid-lost"))  # noqa: SLF001
        with pytest.raises(errors.TransactionError) as failed:
            tx.commit()
        assert stub.calls == 2 and "not known to be committed" in str(failed.value)
        [(message_id, error)] = failed.value.failures
        assert message_id == "lost" and isinstance(error, errors.Timeout) and not error.retriable
        assert "outcome unknown" in str(error) and "no half message" in str(error)
        refused = producer.transaction()  # asked once: the broker's refusal as it is
        refused._sent("t", SendReceipt("once", "t", 0, transaction_id="tid-once"))  # noqa: SLF001
        with pytest.raises(errors.TransactionError, match="not committed") as failed:
            refused.commit()
        assert failed.value.failures[0][1].code_name == "INVALID_TRANSACTION_ID"
    finally:
        producer.close()


async def test_an_asyncio_commit_resent_after_a_lost_answer_and_refused_is_outcome_unknown() -> None:
    stub = LostCommitStub()

    class Stub:
        async def EndTransaction(self, request: pb.EndTransactionRequest, **kw: object) -> pb.EndTransactionResponse:  # noqa: N802
            return stub.EndTransaction(request, **kw)

    producer = aio.Producer("127.0.0.1:1", retry=RetryPolicy(initial_backoff=0.01, max_backoff=0.01))
    producer._channel = FakeChannel()  # noqa: SLF001
    producer._stub_ = Stub()  # type: ignore[assignment]  # noqa: SLF001
    async with producer:
        tx = producer.transaction()
        tx._sent("t", SendReceipt("lost", "t", 0, transaction_id="tid-lost"))  # noqa: SLF001
        with pytest.raises(errors.TransactionError) as failed:
            await tx.commit()
    [(_, error)] = failed.value.failures
    assert isinstance(error, errors.Timeout) and not error.retriable and stub.calls == 2
