"""Transactions through a real broker process, killed with -9 at each step: between a half message and its
resolution, and between a commit and the delivery. The committed message is delivered once, the rolled-back one
never; forged and stale transaction ids are refused by name and change nothing; checks are stored."""

from __future__ import annotations

import grpc
import pytest
from popgate_pb import broker_pb2 as pb

from tests.conftest import BrokerHandle
from tests.integration.broker.test_broker import error_name, pop, send

CHECK_ARGS = ("--transaction-immunity-s", "0", "--transaction-check-interval-s", "60")


def half(b: BrokerHandle, body: bytes) -> str:
    [result] = send(b.stub, "tx", [body], transactional=True).results
    assert result.transaction_id and result.offset == -1
    return result.transaction_id


def end(b: BrokerHandle, transaction_id: str, *, commit: bool) -> None:
    b.stub.EndTransaction(
        pb.EndTransactionRequest(topic="tx", transaction_id=transaction_id, commit=commit), timeout=10
    )


def bodies(b: BrokerHandle, group: str, poll_ms: int = 0) -> list[bytes]:
    return sorted(m.stored.message.body for m in pop(b.stub, "tx", group, poll_ms=poll_ms))


def test_kill_9_between_half_and_commit_and_between_commit_and_delivery(make_broker: object) -> None:
    b: BrokerHandle = make_broker("b1", *CHECK_ARGS)  # type: ignore[operator]
    to_commit, to_roll_back, late = half(b, b"commit"), half(b, b"rollback"), half(b, b"late")
    assert bodies(b, "g") == []
    b.restart(kill=True)  # between the half messages and their resolution
    assert bodies(b, "g") == []
    end(b, to_commit, commit=True)
    end(b, to_roll_back, commit=False)
    b.restart(kill=True)  # between the commit and the delivery
    assert bodies(b, "g") == [b"commit"]
    end(b, late, commit=True)
    b.restart(kill=True)
    assert bodies(b, "g") == [b"late"]
    assert bodies(b, "g2") == [b"commit", b"late"]  # once each, never the rolled-back one
    for stale in (to_commit, to_roll_back, late, "forged"):
        with pytest.raises(grpc.RpcError) as info:
            end(b, stale, commit=True)
        assert error_name(info.value) == "InvalidTransactionId"
    assert bodies(b, "g3") == [b"commit", b"late"]


def test_a_check_handed_out_survives_kill_9_and_is_not_handed_out_again_within_the_interval(
    make_broker: object,
) -> None:
    b: BrokerHandle = make_broker("b1", *CHECK_ARGS)  # type: ignore[operator]
    tid = half(b, b"checked")
    first = b.stub.TransactionChecks(pb.TransactionChecksRequest(topics=["tx"], max_checks=10), timeout=10)
    assert [(c.transaction_id, c.check, c.message.message.body) for c in first.checks] == [(tid, 1, b"checked")]
    b.restart(kill=True)
    again = b.stub.TransactionChecks(pb.TransactionChecksRequest(topics=["tx"], max_checks=10), timeout=10)
    assert list(again.checks) == [] and again.next_due_ms >= first.next_due_ms
    assert 0 < again.next_due_ms - again.now_ms <= 60_000  # the wait, on the broker's own clock (interval 60 s)
    assert first.check_interval_ms == again.check_interval_ms == 60_000  # a proxy sizes its producers' windows by it
    end(b, tid, commit=True)
    assert bodies(b, "g") == [b"checked"]
