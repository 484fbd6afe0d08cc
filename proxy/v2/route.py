"""QueryRoute, QueryAssignment, Heartbeat and NotifyClientTermination."""

from __future__ import annotations

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from proxy import validate
from proxy.v2.context import Call

OK = v2.Status(code=v2.OK, message="OK")
ACCEPTED_TYPES = (v2.NORMAL, v2.FIFO, v2.DELAY)


def _endpoints(call: Call, requested: v2.Endpoints) -> v2.Endpoints:
    # Clients send every later RPC to the endpoints in the route: echo the address they used for us.
    return requested if len(requested.addresses) > 0 else call.endpoints


def _queue(topic: v2.Resource, broker: str, queue_id: int, endpoints: v2.Endpoints) -> v2.MessageQueue:
    return v2.MessageQueue(
        topic=topic,
        id=queue_id,
        permission=v2.READ_WRITE,
        broker=v2.Broker(name=broker, id=0, endpoints=endpoints),
        accept_message_types=ACCEPTED_TYPES,
    )


async def query_route(call: Call, request: pb.QueryRouteRequest) -> pb.QueryRouteResponse:
    validate.topic_in(request.topic.resource_namespace, request.topic.name)
    endpoints = _endpoints(call, request.endpoints)
    queues = [_queue(request.topic, q.broker, q.queue_id, endpoints) for q in call.proxy.route()]
    return pb.QueryRouteResponse(status=OK, message_queues=queues)


async def query_assignment(call: Call, request: pb.QueryAssignmentRequest) -> pb.QueryAssignmentResponse:
    """One assignment per live broker: a push consumer then keeps one receive loop per broker."""
    validate.topic_in(request.topic.resource_namespace, request.topic.name)
    validate.group_in(request.group.resource_namespace, request.group.name)
    endpoints = _endpoints(call, request.endpoints)
    brokers = sorted({q.broker for q in call.proxy.route()})
    assignments = [v2.Assignment(message_queue=_queue(request.topic, b, 0, endpoints)) for b in brokers]
    return pb.QueryAssignmentResponse(status=OK, assignments=assignments)


async def heartbeat(call: Call, request: pb.HeartbeatRequest) -> pb.HeartbeatResponse:
    if request.group.name:
        validate.group_in(request.group.resource_namespace, request.group.name)
    return pb.HeartbeatResponse(status=OK)


async def notify_client_termination(
    call: Call, request: pb.NotifyClientTerminationRequest
) -> pb.NotifyClientTerminationResponse:
    # Nothing to clean up: the proxy keeps no per-client state (un-acked messages simply time out).
    if request.group.name:
        validate.group_in(request.group.resource_namespace, request.group.name)
    return pb.NotifyClientTerminationResponse(status=OK)
