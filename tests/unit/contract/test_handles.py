"""Recall handles and transaction ids (popgate_contract.handles): they round-trip, and anything else is refused
with the error a client is told of (BAD_REQUEST, INVALID_TRANSACTION_ID), never a crash."""

from __future__ import annotations

import base64

import pytest

from popgate_contract.codes import Code, code_of
from popgate_contract.errors import InvalidRecallHandle, InvalidTransactionId
from popgate_contract.handles import RecallHandle, TransactionId


def test_handles_round_trip_also_with_a_tilde_in_the_message_id() -> None:
    handle = RecallHandle("b1", "t", 7, "id~with~tildes")
    assert RecallHandle.decode(handle.encode()) == handle
    tid = TransactionId("b-2", 12, 0xABCDEF)
    assert TransactionId.decode(tid.encode()) == tid


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "!!!",
        "x" * 2000,
        base64.urlsafe_b64encode(b"R1~b1~t~x~id").decode(),
        base64.urlsafe_b64encode("R1~b1~t~²~id".encode()).decode(),  # a digit to str.isdigit, not to int()
        TransactionId("b", 1, 2).encode(),
    ],
)
def test_anything_else_is_an_invalid_recall_handle(text: str) -> None:
    with pytest.raises(InvalidRecallHandle) as caught:
        RecallHandle.decode(text)
    assert code_of(caught.value) == Code.BAD_REQUEST


@pytest.mark.parametrize(
    "text",
    ["", "forged", base64.urlsafe_b64encode(b"T1~b1~1~zz").decode(), RecallHandle("b", "t", 1, "i").encode()],
)
def test_anything_else_is_an_invalid_transaction_id(text: str) -> None:
    with pytest.raises(InvalidTransactionId) as caught:
        TransactionId.decode(text)
    assert code_of(caught.value) == Code.INVALID_TRANSACTION_ID
