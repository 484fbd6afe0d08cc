"""The sans-IO bookkeeping of an AckMessage through its attempts (`popgate._resend`)."""

from __future__ import annotations

import pytest
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import _resend, errors


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
