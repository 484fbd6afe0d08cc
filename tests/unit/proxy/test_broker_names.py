"""A broker's own name, as its health checks' answers say it, against the name the proxy lists it under."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from grpc_health.v1 import health_pb2

from popgate_contract.broker_name import NAME_KEY, name_said
from proxy.brokers import GrpcBrokerClient
from proxy.settings import BrokerAddress


class FakeCheck:
    """A health Check call: SERVING, with the broker's name in its initial metadata when it says one."""

    def __init__(self, said: str | None) -> None:
        self._metadata = ((NAME_KEY, said),) if said is not None else ()

    def __await__(self) -> Any:
        async def reply() -> health_pb2.HealthCheckResponse:
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

        return reply().__await__()

    async def initial_metadata(self) -> Any:
        return self._metadata


class FakeHealth:
    def __init__(self) -> None:
        self.said: str | None = None

    def Check(self, request: Any, timeout: float) -> FakeCheck:  # noqa: N802  # the gRPC method's name
        return FakeCheck(self.said)


def test_the_name_is_read_from_the_answers_metadata_and_none_when_not_said() -> None:
    assert name_said(((NAME_KEY, "b1"),)) == "b1"
    assert name_said((("other", "x"), (NAME_KEY, b"b2"))) == "b2"
    assert name_said(()) is None and name_said(None) is None


async def test_a_broker_running_under_another_name_stays_down_until_a_check_says_the_listed_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = GrpcBrokerClient(BrokerAddress("b2", "127.0.0.1:1"))  # no call made: no socket
    health = client._health = FakeHealth()
    try:
        health.said = "b1"
        with caplog.at_level(logging.ERROR, logger="proxy.brokers"):
            assert not await client.check_health(timeout_s=1)
            assert not await client.check_health(timeout_s=1)
        assert not client.healthy
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "b2" in errors[0] and "'b1'" in errors[0] and "127.0.0.1:1" in errors[0]
        client._succeeded("Send")  # a call that succeeds does not bring it back
        assert not client.healthy

        health.said = "b2"  # now runs under the name it is listed under
        assert await client.check_health(timeout_s=1) and client.healthy
    finally:
        await client.close()


async def test_a_broker_that_does_not_say_its_name_is_taken_as_listed() -> None:
    client = GrpcBrokerClient(BrokerAddress("b2", "127.0.0.1:1"), up=False)
    client._health = FakeHealth()
    try:
        assert await client.check_health(timeout_s=1) and client.healthy
    finally:
        await client.close()
