"""The broker's Stats answer (broker.stats) over a real store without sockets: however many groups read here, it
fits the broker's gRPC message limit, answers each (topic, group) with all its queues or not at all, and says
when some were left out."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from popgate_pb import broker_pb2 as pb

from broker.filters import MATCH_ALL
from broker.stats import stats
from tests.unit.broker.cores import broker

LIMIT = (1 << 20) + (64 << 10)  # the least a broker with 1 MiB Pops and bodies allows
LIMITS: dict[str, Any] = {"max_grpc_message_bytes": LIMIT, "max_pop_bytes": 1 << 20, "max_body_bytes": 1 << 20}


def group_name(i: int) -> str:
    return f"GID_broadcast_consumer_{i:06d}".ljust(64, "_")


async def test_an_answer_stays_under_the_grpc_limit_and_says_groups_were_left_out(tmp_path: Path) -> None:
    """1,000 groups over 4 topics of 16 queues: 16,000 rows, ~1.6 MB, more than the limit allows."""
    async with broker(tmp_path, queues_per_topic=16, **LIMITS) as (core, _):
        await core.send([pb.Message(topic=f"t{t}", body=b"x") for t in range(4)])
        for i in range(1000):
            core.consumers.reader(group_name(i), f"t{i % 4}", MATCH_ALL, [], pop_filter=False)
        out = pb.StatsResponse()
        await stats(core, pb.StatsRequest(), out)
        assert out.ByteSize() <= LIMIT and out.cut
        assert len(out.queues) == 64  # every queue's offsets still answered
        pairs = Counter((row.topic, row.group) for row in out.groups)
        assert len(pairs) > 500 and set(pairs.values()) == {16}  # each pair with all its queues: its sums are right
        one = pb.StatsResponse()
        await stats(core, pb.StatsRequest(topic="t3", group=group_name(999)), one)
        assert len(one.groups) == 16 and not one.cut  # a pair left out is answered when asked for
