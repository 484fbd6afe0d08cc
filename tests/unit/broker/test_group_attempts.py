"""A consumer group's max delivery attempts at a real BrokerCore (no sockets): --group-max-attempts dead-letters
that group's messages after its own number of deliveries, and GroupConfig tells it."""

from __future__ import annotations

from pathlib import Path

from popgate_pb import broker_pb2 as pb

from broker import handlers
from broker.core import BrokerCore
from popgate_contract.errors import IllegalGroup
from tests.unit.broker.cores import broker


async def deliveries(core: BrokerCore, group: str) -> list[int]:
    """Pop and nack (invisible 0: due again at once) the group's message until none comes back within 1 s."""
    attempts = []
    while popped := (await core.pop("t", group, "*", 1, 10_000, 1000)).messages:
        [m] = popped
        attempts.append(m.attempt)
        await core.change_invisible("t", group, m.handle, 0)
    return attempts


async def test_a_group_is_dead_lettered_after_its_own_attempts_the_others_after_the_default(tmp_path: Path) -> None:
    async with broker(tmp_path, max_delivery_attempts=3, group_max_attempts=(("fast", 1),)) as (core, _):
        await core.send([pb.Message(topic="t", body=b"poison")])
        fast, slow = await deliveries(core, "fast"), await deliveries(core, "slow")
        dead = []
        for group in ("fast", "slow"):
            [m] = (await core.pop(f"%DLQ%{group}", "inspect", "*", 1, 10_000, 5000)).messages
            dead.append(pb.Message.FromString(m.payload).properties["DELIVERY_ATTEMPTS"])
    assert (fast, slow, dead) == ([1], [1, 2, 3], ["1", "3"])


async def test_group_config_answers_the_groups_max_attempts(tmp_path: Path) -> None:
    async with broker(tmp_path, max_delivery_attempts=5, group_max_attempts=(("fast", 2),)) as (core, _):
        answers = []
        for group in ("fast", "other"):
            out = pb.GroupConfigResponse()
            await handlers.group_config(core, pb.GroupConfigRequest(group=group), out)
            answers.append(out.max_delivery_attempts)
        try:
            await handlers.group_config(core, pb.GroupConfigRequest(), pb.GroupConfigResponse())
        except IllegalGroup:
            answers.append(0)
    assert answers == [2, 5, 0]
