"""Dead-lettering against the group's other changes while a DLQ commit is on its way: a reset, a topic deleted and
made again. A message goes to the DLQ only while it is still the group's to move, and a failed commit puts back
only what is still the group's to put back."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from popgate_pb import broker_pb2 as pb

from broker import admin
from broker.store import NewMessage, Op
from popgate_contract.errors import StoreUnavailable
from tests.unit.broker.cores import broker
from tests.unit.broker.test_schedule import until

To = pb.ResetOffsetRequest.To


class HeldDeadLetters:
    """The store's DLQ commits held until the test lets them go (a slow disk), to fail or to commit."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.real = store.submit
        self.held: list[tuple[Sequence[NewMessage], Sequence[Op], asyncio.Future[Any]]] = []
        store.submit = self.submit

    def submit(self, appends: Sequence[NewMessage], ops: Sequence[Op], **how: Any) -> asyncio.Future[Any]:
        if not any(a.topic.startswith("%DLQ%") for a in appends):
            return self.real(appends, ops, **how)  # type: ignore[no-any-return]
        outer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.held.append((appends, ops, outer))
        return outer

    def commit_all(self) -> None:
        self.store.submit = self.real
        for appends, ops, outer in self.held:
            self.real(appends, ops).add_done_callback(
                lambda done, outer=outer: (
                    outer.set_exception(done.exception()) if done.exception() else outer.set_result(done.result())
                )
            )


async def test_a_failed_dead_letter_after_a_reset_does_not_take_the_new_delivery_back(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1, max_delivery_attempts=1) as (core, store):
        await core.send([pb.Message(topic="t", body=b"m")])
        await core.pop("t", "g", "*", 1, 100, 0)  # its last attempt: due for the DLQ in 0.1 s
        dlq = HeldDeadLetters(store)
        await until(lambda: len(dlq.held) == 1)
        await admin.reset_offset(
            core, pb.ResetOffsetRequest(topic="t", group="g", to=To.EARLIEST), pb.ResetOffsetResponse()
        )
        again = await core.pop("t", "g", "*", 1, 30_000, 0)  # the reset's delivery of it: attempt 1, 30 s
        dlq.held[0][2].set_exception(StoreUnavailable("disk full"))
        await asyncio.sleep(0)
        assert await core.ack("t", "g", [again.messages[0].handle]) == [None]  # the new delivery stays the group's
        assert core.redelivery.ready_count(core.groups[("g", "t")]) == 0


async def test_dead_letters_of_a_deleted_topic_do_not_take_its_new_messages(tmp_path: Path) -> None:
    """70 messages out of attempts: 64 movers commit (slowly), 6 wait for one. The topic is deleted and sent to
    again meanwhile: none of the new topic's messages, which nobody received, goes to the DLQ."""
    async with broker(tmp_path, queues_per_topic=1, max_delivery_attempts=1) as (core, store):
        await core.send([pb.Message(topic="t", body=b"old%d" % i) for i in range(70)])
        dlq = HeldDeadLetters(store)
        await core.pop("t", "g", "*", 70, 100, 0)
        await until(lambda: len(dlq.held) == 64)
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        await core.send([pb.Message(topic="t", body=b"new%d" % i) for i in range(70)])
        dlq.commit_all()
        await until(lambda: not core.redelivery._to_dlq and core.redelivery._movers == 0)  # noqa: SLF001
        letters = await core.list_messages("%DLQ%g", 0, 0, 1000)
        bodies = [pb.Message.FromString(r.payload).body for r in letters]
        assert all(b.startswith(b"old") for b in bodies) and len(bodies) == 64
        got = await core.pop("t", "g2", "*", 128, 30_000, 0)
        assert len(got.messages) == 70  # the new topic whole
