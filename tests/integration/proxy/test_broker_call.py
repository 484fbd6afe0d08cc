"""A broker call of the proxy (`proxy.broker_call.BrokerCall`) against a real broker: held, it keeps nothing but itself
and its timer; cancelled or past its timeout, the broker drops the request it held."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.brokers import GrpcBrokerClient
from proxy.ports import NoMetrics
from proxy.settings import BrokerAddress
from tests.procs import ServerProcess, broker_args
from tests.unit.proxy.fakes import one_send


class Outcomes(NoMetrics):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def broker_rpc(self, broker: str, method: str, outcome: str) -> None:
        self.seen.append((method, outcome))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess("broker", broker_args("b1", tmp_path / "b1")).start()
    yield process
    process.stop()


def held_pop(topic: str) -> bpb.PopRequest:
    return bpb.PopRequest(topic=topic, group="g", filter="*", max_messages=1, invisible_ms=30_000, poll_ms=30_000)


async def held_at(client: GrpcBrokerClient) -> int:
    stats = await client.stats(bpb.StatsRequest(), timeout_s=5)
    return stats.held_pops


async def until_held(client: GrpcBrokerClient, count: int) -> None:
    async with asyncio.timeout(10):
        while await held_at(client) != count:  # noqa: ASYNC110  # another process: no event to wait on
            await asyncio.sleep(0.01)


def test_a_held_call_keeps_no_done_callback_and_its_cancel_ends_the_brokers_hold(broker: ServerProcess) -> None:
    async def scenario() -> list[tuple[str, str]]:
        metrics = Outcomes()
        client = GrpcBrokerClient(BrokerAddress("b1", broker.address), metrics=metrics)
        try:
            await client.send(one_send(bpb.Message(topic="t", body=b"create")), timeout_s=5)
            call = client.begin_pop(held_pop("empty"), timeout_s=60)
            await until_held(client, 1)
            assert not call.done()
            # What a held receive keeps per broker: the call and its timer, no callback, context or partial.
            assert not call._callbacks  # type: ignore[attr-defined]
            call.cancel()
            await until_held(client, 0)
            return metrics.seen
        finally:
            await client.close()

    assert ("Pop", "cancelled") in asyncio.run(scenario())


def test_a_call_past_its_timeout_fails_and_the_broker_drops_the_request(broker: ServerProcess) -> None:
    """The Pop would be held 30 s: nothing held well before then means the broker dropped it at the timeout."""

    async def scenario() -> BaseException | None:
        client = GrpcBrokerClient(BrokerAddress("b1", broker.address))
        try:
            call = client.begin_pop(held_pop("empty"), timeout_s=1.0)
            error = None
            try:
                await call
            except errors.DomainError as exc:
                error = exc
            await until_held(client, 0)
            return error
        finally:
            await client.close()

    assert isinstance(asyncio.run(scenario()), errors.BrokerTimeout)
