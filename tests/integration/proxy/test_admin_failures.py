"""Which of a broker's failed admin calls the proxy reports as maybe applied (BrokerFailure.outcome_unknown): one
that reached the broker and ended without an answer (its deadline, the broker stopping mid-call, its store refusing
the commit) may have changed it; one that never left (nothing listening) or that the broker refused did not. The
texts grpc gives are its own, so the cut and unreached calls are real calls to a real grpc.aio server."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from popgate_contract import errors
from popgate_contract.trailer import error_of
from proxy.admin import _may_have_applied


class Held(health_pb2_grpc.HealthServicer):
    """Answers nothing until the server stops."""

    async def Check(self, request: health_pb2.HealthCheckRequest, context: object) -> health_pb2.HealthCheckResponse:
        await asyncio.sleep(60)
        return health_pb2.HealthCheckResponse()


async def failure_of(call: asyncio.Future[object]) -> errors.DomainError:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call
    return error_of(failed.value, "b1")


async def test_a_call_cut_by_the_broker_stopping_may_have_applied_one_to_nothing_listening_did_not() -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(Held(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)  # type: ignore[no-untyped-call]
        held = asyncio.ensure_future(stub.Check(health_pb2.HealthCheckRequest(), timeout=10))
        await asyncio.sleep(0.2)  # the call is at the server
        await server.stop(0)
        cut = await failure_of(held)
        assert _may_have_applied(cut), cut.message
        unreached = await failure_of(stub.Check(health_pb2.HealthCheckRequest(), timeout=5))
        assert not _may_have_applied(unreached), unreached.message


@pytest.mark.parametrize(
    ("error", "maybe"),
    [
        (errors.BrokerTimeout("broker b1 did not answer in time"), True),
        (errors.StoreUnavailable("the store refused the commit"), True),
        (errors.BrokerFailure("broker b1 failed: INTERNAL: boom"), True),
        (errors.BrokerNotReached("broker b1 is no longer reached by this proxy"), False),
        (errors.TooManyRequests("topic t is being deleted on broker b1: still at this call's deadline"), False),
        (errors.BadRequest("bad topic"), False),
    ],
)
def test_what_a_broker_refused_was_not_applied_what_ended_unanswered_may_have_been(
    error: errors.DomainError, maybe: bool
) -> None:
    assert _may_have_applied(error) is maybe
