"""Recall and EndTransaction at the proxy (proxy.producer, proxy.v2.producer), no sockets: each goes to the
broker its handle or transaction id names; one that names no known broker, or is no handle at all, is refused with
the client's code before any broker is asked; an UNSPECIFIED resolution changes nothing."""

from __future__ import annotations

import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from popgate_contract.handles import RecallHandle, TransactionId
from proxy.producer import ProducerFeatures
from proxy.routing import BrokerPool
from proxy.settings import BrokerAddress, Settings
from proxy.v2.context import Call
from proxy.v2.convert import SendLimits, to_broker
from proxy.v2.producer import end_transaction, recall_message


class FakeBroker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.healthy = True
        self.calls: list[object] = []

    async def recall(self, request: bpb.RecallRequest, *, timeout_s: float) -> bpb.RecallResponse:
        self.calls.append(request)
        return bpb.RecallResponse(message_id="m1")

    async def end_transaction(
        self, request: bpb.EndTransactionRequest, *, timeout_s: float
    ) -> bpb.EndTransactionResponse:
        self.calls.append(request)
        return bpb.EndTransactionResponse()


def setup() -> tuple[ProducerFeatures, FakeBroker, Call]:
    broker = FakeBroker("b1")
    features = ProducerFeatures(BrokerPool({"b1": broker}))  # type: ignore[dict-item, arg-type, return-value]
    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    return features, broker, Call(None, settings, v2.Endpoints(), None)  # type: ignore[arg-type]


async def test_recall_and_end_transaction_go_to_the_broker_they_name() -> None:
    features, broker, call = setup()
    handle = RecallHandle("b1", "ns%t", 1, "m1").encode()
    topic = v2.Resource(name="t", resource_namespace="ns")
    answer = await recall_message(features, call, pb.RecallMessageRequest(topic=topic, recall_handle=handle))
    assert answer.message_id == "m1" and broker.calls[-1].topic == "ns%t"  # type: ignore[attr-defined]
    tid = TransactionId("b1", 3, 9).encode()
    request = pb.EndTransactionRequest(topic=topic, message_id="m1", transaction_id=tid, resolution=v2.ROLLBACK)
    assert (await end_transaction(features, call, request)).status.code == v2.OK
    sent = broker.calls[-1]
    assert (sent.transaction_id, sent.commit, sent.from_check) == (tid, False, False)  # type: ignore[attr-defined]
    request.resolution = v2.TRANSACTION_RESOLUTION_UNSPECIFIED  # a checker's "unknown": nothing is asked
    assert (await end_transaction(features, call, request)).status.code == v2.OK and len(broker.calls) == 2


@pytest.mark.parametrize(
    ("handle", "tid"),
    [
        ("garbage", "garbage"),
        (RecallHandle("b9", "t", 1, "m").encode(), TransactionId("b9", 1, 2).encode()),  # an unknown broker's
    ],
)
async def test_a_handle_or_id_naming_no_known_broker_is_refused_before_any_broker_is_asked(
    handle: str, tid: str
) -> None:
    features, broker, call = setup()
    topic = v2.Resource(name="t")
    with pytest.raises(errors.InvalidRecallHandle):
        await recall_message(features, call, pb.RecallMessageRequest(topic=topic, recall_handle=handle))
    request = pb.EndTransactionRequest(topic=topic, message_id="m", transaction_id=tid, resolution=v2.COMMIT)
    with pytest.raises(errors.InvalidTransactionId):
        await end_transaction(features, call, request)
    assert broker.calls == []


def transaction(seconds: int, nanos: int = 0, *, message_type: v2.MessageType = v2.TRANSACTION) -> v2.Message:
    message = v2.Message(topic=v2.Resource(name="t"), body=b"x")
    message.system_properties.message_type = message_type
    recovery = message.system_properties.orphaned_transaction_recovery_duration
    recovery.seconds, recovery.nanos = seconds, nanos
    return message


def test_a_transactions_recovery_duration_over_an_hour_is_a_bad_request() -> None:
    """As RocketMQ's proxy (maxTransactionRecoverySecond, 1 h, compared in whole seconds): a TRANSACTION message
    asking for more is refused; an hour, or a NORMAL message's field, which RocketMQ does not read, is taken."""
    limits = SendLimits(max_body_bytes=1024, max_delay_s=86400)
    for message in (transaction(2 * 3600), transaction(3601), transaction(1, 1_000_000_000)):
        with pytest.raises(errors.BadRequest, match="orphaned_transaction_recovery_duration"):
            to_broker(message, limits, now_s=0)
    assert to_broker(transaction(3600, 999_999_999), limits, now_s=0).transactional
    assert to_broker(transaction(0), limits, now_s=0).transactional
    assert not to_broker(transaction(2 * 3600, message_type=v2.NORMAL), limits, now_s=0).transactional
