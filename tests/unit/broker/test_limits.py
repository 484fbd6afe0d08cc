"""The broker keeps consumer-group state for a bounded number of (group, topic) pairs (`--max-groups`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker.errors import TooManyRequests
from tests.unit.broker.cores import broker


def test_a_new_group_beyond_the_limit_is_too_many_requests_and_the_known_ones_go_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with broker(tmp_path / "data", max_groups=2) as (core, _):
            await core.send([pb.Message(topic="t", body=b"x")])
            assert len((await core.pop("t", "g1", "*", 1, 30_000, 0)).messages) == 1
            assert await core.notification("t", "g2", "*", 0) == (True, False)
            with pytest.raises(TooManyRequests, match="--max-groups"):
                await core.pop("t", "g3", "*", 1, 30_000, 0)
            with pytest.raises(TooManyRequests, match="--max-groups"):
                await core.notification("t", "g3", "*", 0)
            assert len((await core.pop("t", "g2", "*", 1, 30_000, 0)).messages) == 1
            assert sorted({row.group for row in core.lags()}) == ["g1", "g2"]

    asyncio.run(scenario())
