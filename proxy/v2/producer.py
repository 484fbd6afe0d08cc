"""RecallMessage and EndTransaction: v2 requests to the core's producer features (proxy.producer)."""

from __future__ import annotations

import asyncio

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from proxy import validate
from proxy.producer import ProducerFeatures
from proxy.v2.context import Call

OK = v2.Status(code=v2.OK, message="OK")
MIN_CALL_S = 0.05
REPLY_RESERVE_S = 0.3  # answered this long before the client's deadline


def timeout_s(call: Call) -> float:
    if call.deadline is None:
        return call.settings.broker_timeout_s
    left = call.deadline - asyncio.get_running_loop().time() - REPLY_RESERVE_S
    return max(MIN_CALL_S, min(call.settings.broker_timeout_s, left))


async def recall_message(
    features: ProducerFeatures, call: Call, request: pb.RecallMessageRequest
) -> pb.RecallMessageResponse:
    topic = validate.topic_in(request.topic.resource_namespace, request.topic.name)
    message_id = await features.recall(topic, request.recall_handle, timeout_s=timeout_s(call))
    return pb.RecallMessageResponse(status=OK, message_id=message_id)


async def end_transaction(
    features: ProducerFeatures, call: Call, request: pb.EndTransactionRequest
) -> pb.EndTransactionResponse:
    topic = validate.topic_in(request.topic.resource_namespace, request.topic.name)
    if not request.transaction_id:
        raise errors.InvalidTransactionId("transaction id is empty")
    if request.resolution not in (v2.COMMIT, v2.ROLLBACK):
        if request.resolution == v2.TRANSACTION_RESOLUTION_UNSPECIFIED:
            return pb.EndTransactionResponse(status=OK)  # RocketMQ's UNKNOWN: nothing changes, checked again later
        raise errors.BadRequest(f"EndTransaction resolution {request.resolution} is not COMMIT or ROLLBACK")
    await features.end_transaction(
        topic,
        validate.message_id(request.message_id),
        request.transaction_id,
        commit=request.resolution == v2.COMMIT,
        from_check=request.source == v2.SOURCE_SERVER_CHECK,
        timeout_s=timeout_s(call),
    )
    return pb.EndTransactionResponse(status=OK)
