"""A message query's bounds (broker.lookup, broker.admin.query_messages) over a real store without sockets: what it
holds while it scans grows with the matches asked for, not with the topic's queues."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from popgate_pb import broker_pb2 as pb

from broker import admin
from tests.unit.broker.cores import broker


async def test_a_querys_memory_grows_with_the_matches_asked_not_the_queues(tmp_path: Path) -> None:
    """64 queues of 50 matching 16 KB messages each, 50 asked for: what the query holds is about 50 matches, not
    64 × 50 (each with its payload and its decoded message)."""
    body = b"y" * 16_000
    async with broker(tmp_path, queues_per_topic=64, max_send_bytes=64 << 20) as (core, _):
        for _ in range(25):
            await core.send([pb.Message(topic="t", body=body, keys=["K"]) for _ in range(128)])
        out = pb.QueryMessagesResponse()
        tracemalloc.start()
        try:
            await admin.query_messages(core, pb.QueryMessagesRequest(topic="t", key="K", max_messages=50), out)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(out.messages) == 50
        assert peak < 16 << 20, f"peak {peak / 2**20:.0f} MiB for 50 matches"  # 64 × 50 matches: ~100 MiB
