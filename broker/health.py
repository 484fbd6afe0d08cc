"""The broker's grpc.health.v1 service: the standard one, whose Check answers also say the broker's own name
(`popgate_contract.broker_name`), so that a proxy listing it under another name keeps it out of routing —
tests/integration/proxy/test_broker_names.py."""

from __future__ import annotations

from typing import Any

from grpc_health.v1 import health, health_pb2

from popgate_contract.broker_name import NAME_KEY


class NamedHealthServicer(health.aio.HealthServicer):  # type: ignore[misc]
    def __init__(self, name: str) -> None:
        super().__init__()
        self._name_said = ((NAME_KEY, name),)

    async def Check(  # noqa: N802  # the gRPC method's name
        self, request: health_pb2.HealthCheckRequest, context: Any
    ) -> health_pb2.HealthCheckResponse:
        await context.send_initial_metadata(self._name_said)
        return await super().Check(request, context)
