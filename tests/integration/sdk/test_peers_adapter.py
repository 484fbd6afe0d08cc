"""bench/peers_adapter.py: popgate's adapter for the peers' harness connects in setup(), before the measured windows,
as the NATS and Redis adapters do (skipped without the harness's qadapter module, shared/peers)."""

from __future__ import annotations

import asyncio
import sys
import uuid

import grpc
import pytest

from bench.peers_run import PEERS


def test_setup_connects_every_client_and_sends_nothing(endpoint: str) -> None:
    sys.path.append(str(PEERS))
    pytest.importorskip("qadapter")
    from bench.peers_adapter import PopgateAdapter

    async def run() -> None:
        name = f"peers-{uuid.uuid4().hex[:8]}"
        adapter = PopgateAdapter(endpoint=endpoint, topic=name, group=name, channels=2)
        try:
            await adapter.setup()
            clients = [adapter._producer, *adapter._consumers]
            assert [c._channel.get_state() for c in clients] == [grpc.ChannelConnectivity.READY] * 3
            assert [c._session for c in clients] == [None] * 3  # no request made yet
        finally:
            await adapter.close()

    asyncio.run(run())
