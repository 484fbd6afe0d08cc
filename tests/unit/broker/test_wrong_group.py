"""An ack under another consumer group's name, at a real BrokerCore (no sockets): refused, and the refusal says
that group has no in-flight delivery of the message instead of calling the handle stale (which sent its user
looking for a double delivery)."""

from __future__ import annotations

from pathlib import Path

from popgate_pb import broker_pb2 as pb

from popgate_contract.errors import InvalidReceiptHandle
from tests.unit.broker.cores import broker


async def test_an_ack_under_another_groups_name_says_that_group_has_no_such_delivery(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        [m] = (await core.pop("t", "workers", "*", 1, 30_000, 0)).messages
        await core.pop("t", "audit", "*", 1, 30_000, 0)  # another group that reads the topic too
        refusals = [await core.ack("t", group, [m.handle]) for group in ("billing", "audit")]
        assert await core.ack("t", "workers", [m.handle]) == [None]  # its own group's ack still works
        assert all(isinstance(e, InvalidReceiptHandle) for [e] in refusals)
        never_read, read_too = [str(e) for [e] in refusals]
    assert never_read.startswith("consumer group billing has no in-flight delivery of message t/0/0")
    assert read_too.startswith("consumer group audit has no in-flight delivery of message t/0/0")
    assert "another group's" in read_too and "stale" not in read_too
