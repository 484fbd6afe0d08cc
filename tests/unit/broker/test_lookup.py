"""A message query's bounds (broker.lookup, broker.admin.query_messages) over a real store without sockets: its
answer fits the broker's gRPC message limit, saying older matches were left out, and what it holds while it scans
grows with the matches asked for, not with the topic's queues."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from popgate_pb import broker_pb2 as pb

from broker import admin
from tests.unit.broker.cores import broker

LIMIT = (1 << 20) + (64 << 10)  # the least a broker with 1 MiB Pops and bodies allows


async def test_an_answer_stays_under_the_grpc_limit_and_says_older_matches_were_left_out(tmp_path: Path) -> None:
    """Messages with 64 keys and properties of 16 KiB together (the most a message may carry): 100 of them do not
    fit ~1 MiB."""
    props = {"p": "v" * 250}
    keys = ["K"] + [f"{i:03d}" + "k" * 253 for i in range(63)]
    limits = {"max_grpc_message_bytes": LIMIT, "max_pop_bytes": 1 << 20, "max_body_bytes": 1 << 20}
    async with broker(tmp_path, queues_per_topic=1, **limits) as (core, _):
        for i in range(100):
            await core.send([pb.Message(topic="t", body=b"x", keys=keys, properties=props, message_id=f"id{i}")])
        out = pb.QueryMessagesResponse()
        await admin.query_messages(core, pb.QueryMessagesRequest(topic="t", key="K", max_messages=1000), out)
        assert 20 < len(out.messages) < 100 and out.ByteSize() <= LIMIT
        assert out.scan_cut  # older matches were not answered
        assert [m.stored.message.message_id for m in out.messages[:2]] == ["id99", "id98"]  # the newest


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
