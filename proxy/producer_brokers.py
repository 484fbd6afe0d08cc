"""The broker calls of the producer features (Recall, EndTransaction, TransactionChecks), over each broker's
channel as `proxy.brokers` made it.

`proxy.ports.BrokerClient` has no method for them yet; until it does, these unary calls use the client's own
stub (the same channel and token, no connection of their own), and map a failure to the same domain errors
(`popgate_contract.trailer.error_of`). A client without a stub (a test double) counts as unreachable.
"""

from __future__ import annotations

from typing import Any, Protocol

import grpc
from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from popgate_contract.trailer import error_of
from proxy.ports import BrokerClient


class ProducerCalls(Protocol):
    """One broker's producer calls; raise DomainError subclasses."""

    async def recall(self, request: bpb.RecallRequest, *, timeout_s: float) -> bpb.RecallResponse: ...

    async def end_transaction(
        self, request: bpb.EndTransactionRequest, *, timeout_s: float
    ) -> bpb.EndTransactionResponse: ...

    async def transaction_checks(
        self, request: bpb.TransactionChecksRequest, *, timeout_s: float
    ) -> bpb.TransactionChecksResponse: ...


class StubCalls:
    def __init__(self, client: BrokerClient) -> None:
        self._client = client

    async def _call(self, method: str, request: Any, timeout_s: float) -> Any:
        stub = getattr(self._client, "_stub", None)
        if stub is None:
            raise errors.BrokerUnavailable(f"broker {self._client.name} offers no {method} call")
        try:
            return await getattr(stub, method)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_of(exc, self._client.name) from None

    async def recall(self, request: bpb.RecallRequest, *, timeout_s: float) -> bpb.RecallResponse:
        response: bpb.RecallResponse = await self._call("Recall", request, timeout_s)
        return response

    async def end_transaction(
        self, request: bpb.EndTransactionRequest, *, timeout_s: float
    ) -> bpb.EndTransactionResponse:
        response: bpb.EndTransactionResponse = await self._call("EndTransaction", request, timeout_s)
        return response

    async def transaction_checks(
        self, request: bpb.TransactionChecksRequest, *, timeout_s: float
    ) -> bpb.TransactionChecksResponse:
        response: bpb.TransactionChecksResponse = await self._call("TransactionChecks", request, timeout_s)
        return response
