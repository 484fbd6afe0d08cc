"""The producer features beyond Send, protocol-neutral: recall of scheduled messages and the resolution of
transactions, each routed to the broker its handle or transaction id names (any proxy serves any of them).

Calls reach brokers through the pool's clients (`proxy.ports.BrokerClient`), so unit tests give fakes.
"""

from __future__ import annotations

from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from popgate_contract.handles import RecallHandle, TransactionId
from proxy.ports import BrokerClient
from proxy.routing import BrokerPool


class ProducerFeatures:
    def __init__(self, pool: BrokerPool) -> None:
        self.pool = pool

    def _calls(self, broker: str, error: type[errors.DomainError], what: str) -> BrokerClient:
        client = self.pool.get(broker)
        if client is None:
            raise error(f"{what} names broker {broker}, which this proxy does not know")
        return client

    async def recall(self, topic: str, handle: str, *, timeout_s: float) -> str:
        """Withdraw a scheduled message; its message id."""
        broker = RecallHandle.decode(handle).broker
        calls = self._calls(broker, errors.InvalidRecallHandle, "the recall handle")
        response = await calls.recall(bpb.RecallRequest(topic=topic, recall_handle=handle), timeout_s=timeout_s)
        return response.message_id

    async def end_transaction(
        self, topic: str, message_id: str, transaction_id: str, *, commit: bool, from_check: bool, timeout_s: float
    ) -> None:
        """Commit or roll back a half message."""
        broker = TransactionId.decode(transaction_id).broker
        calls = self._calls(broker, errors.InvalidTransactionId, "the transaction id")
        request = bpb.EndTransactionRequest(
            topic=topic, message_id=message_id, transaction_id=transaction_id, commit=commit, from_check=from_check
        )
        await calls.end_transaction(request, timeout_s=timeout_s)
