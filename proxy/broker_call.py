"""One Session request of a broker client (`proxy.brokers.GrpcBrokerClient.begin`) as a future."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc

from popgate_contract.session_client import BrokerSession

if TYPE_CHECKING:
    from proxy.brokers import GrpcBrokerClient


# Broker methods carried on the Session stream: method name (for metrics) → the request's field.
SESSION_FIELDS = {
    "Send": "send",
    "Pop": "pop",
    "Ack": "ack",
    "ChangeInvisibleTime": "change_invisible",
    "ChangeInvisibleTimes": "change_invisible_many",
    "Renew": "renew",
    "Notification": "notification",
    "GroupConfig": "group_config",
    "EndTransaction": "end_transaction",
}


class BrokerCall(asyncio.Future):  # type: ignore[type-arg]
    """The future `GrpcBrokerClient.begin` returns: one Session request, settled by its answer, its timeout or its
    cancel (which cancels the broker request: a cancel frame). It names its request, so that an answer nobody used
    can be handed back to the broker (`GrpcBrokerClient.release`).

    A held receive keeps one per broker it waits on, so it is one object with its timer: it is the session's
    answer callback itself and settles where it is settled, with no done callback (whose context, partial and
    list a held call would keep) — tests/integration/proxy/test_broker_call.py."""

    __slots__ = ("client", "method", "session", "request_id", "timer")  # set by `begin` (no __init__: made as a
    client: GrpcBrokerClient  # plain future is)
    method: str
    session: BrokerSession
    request_id: int
    timer: asyncio.TimerHandle

    def __call__(self, answer: Any) -> None:
        """The broker's answer (a SessionResponse), or the stream's error."""
        self.client.answered(self, answer)

    def expire(self) -> None:
        if not self.done():
            exc = grpc.aio.AioRpcError(
                grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "deadline", None
            )
            self.set_exception(self.client.failed(self.method, exc))
            self.settle()

    def cancel(self, msg: Any = None) -> bool:
        if not super().cancel(msg):
            return False
        self.client.count(self.method, "cancelled")
        self.settle()
        return True

    def settle(self) -> None:
        """Once done: no timer left, and the broker drops the request unless it answered it."""
        self.timer.cancel()
        self.session.cancel(self.request_id)  # a no-op once answered
