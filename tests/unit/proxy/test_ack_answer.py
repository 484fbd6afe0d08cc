"""AckMessage's answer (proxy/v2/ack.py): one entry per request entry, in order, each with its message id, its
receipt handle and its own status; the answer's status OK, the shared error, or MULTIPLE_RESULTS."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from proxy.v2.ack import ack_message


class _Proxy:
    metrics = None

    def __init__(self, outcome: list[errors.DomainError | None]) -> None:
        self.outcome = outcome

    async def ack(self, topic: str, group: str, handles: Any, *, deadline: float | None = None) -> Any:
        assert list(handles) == [f"h{i}" for i in range(len(self.outcome))]
        return self.outcome


async def answer(outcome: list[errors.DomainError | None]) -> pb.AckMessageResponse:
    request = pb.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="t"))
    for i in range(len(outcome)):
        request.entries.add(message_id=f"m{i}", receipt_handle=f"h{i}")
    return await ack_message(SimpleNamespace(proxy=_Proxy(outcome), deadline=None), request)  # type: ignore[arg-type]


async def test_each_entry_of_an_ack_answer_carries_its_message_handle_and_status() -> None:
    ok = await answer([None, None, None])
    assert ok.status == v2.Status(code=v2.OK, message="OK")
    assert [(e.message_id, e.receipt_handle, e.status) for e in ok.entries] == [
        (f"m{i}", f"h{i}", v2.Status(code=v2.OK, message="OK")) for i in range(3)
    ]
    stale = errors.InvalidReceiptHandle("stale")
    mixed = await answer([None, stale, None])
    assert mixed.status.code == v2.MULTIPLE_RESULTS
    assert [e.status.code for e in mixed.entries] == [v2.OK, v2.INVALID_RECEIPT_HANDLE, v2.OK]
    assert mixed.entries[1].status.message and mixed.entries[1].receipt_handle == "h1"
    failed = await answer([stale, stale])
    assert failed.status.code == v2.INVALID_RECEIPT_HANDLE
