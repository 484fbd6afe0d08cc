"""QueryRoute, QueryAssignment, Heartbeat and NotifyClientTermination."""

from __future__ import annotations

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from proxy import validate
from proxy.consumers import wall_ms
from proxy.v2.context import Call

OK = v2.Status(code=v2.OK, message="OK")
ACCEPTED_TYPES = (v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION, v2.PRIORITY)


MAX_ENDPOINT_ADDRESSES = 16
MAX_HOST_LEN = 255  # a DNS name's limit


def _endpoints(call: Call, requested: v2.Endpoints) -> v2.Endpoints:
    """Clients send every later RPC to the endpoints in the route: echo the address they used for us. Echoed
    into every queue, they are held to what an address list can be (MAX_ENDPOINT_ADDRESSES, MAX_HOST_LEN), so a
    route answer's size is bounded whatever the request —
    tests/unit/proxy/test_v2_service.py::test_a_route_echoes_sane_endpoints_and_refuses_an_endless_list."""
    addresses = requested.addresses
    if not addresses:
        return call.endpoints
    if len(addresses) > MAX_ENDPOINT_ADDRESSES:
        raise errors.BadRequest(f"endpoints list {len(addresses)} addresses, at most {MAX_ENDPOINT_ADDRESSES}")
    for address in addresses:
        if not 0 < len(address.host) <= MAX_HOST_LEN or not 0 < address.port <= 65535:
            raise errors.BadRequest(
                f"endpoint address {address.host[:64]!r}:{address.port} is not a host (1..{MAX_HOST_LEN} characters)"
                " and port (1..65535)"
            )
    return requested


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
        group = validate.group_in(request.group.resource_namespace, request.group.name)
        call.proxy.consumers.seen(call.client_id, group, wall_ms())  # a live consumer (proxy.consumers)
    # Alive: its auto_renew receives here (of this account's client of that id) go on being renewed.
    call.proxy.renewer.heard(call.client_id, account=call.account)
    return pb.HeartbeatResponse(status=OK)


async def notify_client_termination(
    call: Call, request: pb.NotifyClientTerminationRequest
) -> pb.NotifyClientTerminationResponse:
    # Its auto_renew handles (of this account's client of that id, and group) are given back: Renewer.terminated.
    group = validate.group_in(request.group.resource_namespace, request.group.name) if request.group.name else ""
    await call.proxy.renewer.terminated(call.client_id, account=call.account, group=group)
    if group or not call.account:  # with accounts, a consumer's own (it names its group, whose rights it has)
        # Only that group's sighting with accounts: another account's client of the same id stays listed —
        # tests/unit/proxy/test_admin_fanout.py::test_a_termination_naming_a_group_ends_only_that_groups_sighting
        call.proxy.consumers.gone(call.client_id, group if call.account else "")
    return pb.NotifyClientTerminationResponse(status=OK)
