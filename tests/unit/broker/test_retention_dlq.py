"""Retention deletes a `%DLQ%<group>` topic once every letter in it is past the retention and nothing of its
group is left here: a deleted group's dead-letter topic does not stay for good (docs/BROKER.md "Retention")."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from popgate_pb import broker_pb2 as pb

from broker import admin
from broker.core import BrokerCore
from tests.unit.broker.cores import ManualClock, broker

HOUR_MS = 3600 * 1000
T0 = 1_800_000_000_000
SETTINGS: dict[str, Any] = {"queues_per_topic": 1, "retention_s": 3600.0, "flush": "sync"}


def stored_topics(data: Path) -> list[str]:
    with closing(sqlite3.connect(data / "broker.sqlite3")) as conn, conn:
        return [t for (t,) in conn.execute("SELECT DISTINCT topic FROM queues ORDER BY 1")]


async def dead_letter(core: BrokerCore, group: str) -> None:
    await core.send([pb.Message(topic="t", body=b"x")])
    [m] = (await core.pop("t", group, "*", 1, 30_000, 0)).messages
    await core.dead_letter("t", group, m.handle)


async def test_a_deleted_groups_dlq_topic_goes_once_its_letters_expired(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
        await dead_letter(core, "gone")
        await dead_letter(core, "live")
        await admin.delete_group(core, pb.DeleteGroupRequest(group="gone"), pb.DeleteGroupResponse())
        await core.retention.run(T0 + HOUR_MS // 2)  # its letter is not past the retention yet
        assert "%DLQ%gone" in core.topics
        clock.now = T0 + 2 * HOUR_MS
        await core.retention.run()
        # the live group's letters keep their last row as any queue does; the deleted group's topic is gone
        assert sorted(core.topics) == ["%DLQ%live", "t"]
        assert stored_topics(tmp_path) == ["%DLQ%live", "t"]
        await dead_letter(core, "gone")  # the group made again dead-letters into a new topic
        assert core.topics["%DLQ%gone"].queues[0].max_offset == 1
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
        assert sorted(core.topics) == ["%DLQ%gone", "%DLQ%live", "t"]


async def test_a_dlq_topic_with_a_letter_held_invisible_stays(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
        await dead_letter(core, "gone")
        await admin.delete_group(core, pb.DeleteGroupRequest(group="gone"), pb.DeleteGroupResponse())
        [letter] = (await core.pop("%DLQ%gone", "reader", "*", 1, 3 * HOUR_MS, 0)).messages
        clock.now = T0 + 2 * HOUR_MS
        await core.retention.run()
        assert "%DLQ%gone" in core.topics  # its reader may still ack it
        assert await core.ack("%DLQ%gone", "reader", [letter.handle]) == [None]
        await admin.delete_group(core, pb.DeleteGroupRequest(group="reader"), pb.DeleteGroupResponse())
        await core.retention.run()
        assert sorted(core.topics) == ["t"]


async def test_an_operator_created_empty_dlq_topic_and_its_watchers_state_stay(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with broker(tmp_path, clock=clock, **{**SETTINGS, "auto_create": False}) as (core, _):
        out = pb.CreateTopicResponse()
        await admin.create_topic(core, pb.CreateTopicRequest(topic="%DLQ%orders"), out)
        assert out.created
        assert (await core.pop("%DLQ%orders", "dlq-watch", "*", 1, 30_000, 0)).messages == []
        clock.now = T0 + 2 * HOUR_MS
        await core.retention.run()  # the topic never held a letter: nothing of it is past the retention
        assert "%DLQ%orders" in core.topics
        assert ("dlq-watch", "%DLQ%orders") in core.groups
        assert (await core.pop("%DLQ%orders", "dlq-watch", "*", 1, 30_000, 0)).messages == []


async def test_a_dlq_topic_another_group_has_state_on_stays(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
        await dead_letter(core, "gone")
        await admin.delete_group(core, pb.DeleteGroupRequest(group="gone"), pb.DeleteGroupResponse())
        [letter] = (await core.pop("%DLQ%gone", "dlq-watch", "*", 1, 30_000, 0)).messages
        assert await core.ack("%DLQ%gone", "dlq-watch", [letter.handle]) == [None]
        clock.now = T0 + 2 * HOUR_MS
        await core.retention.run()
        assert "%DLQ%gone" in core.topics  # the watcher's offsets on it are kept
        assert ("dlq-watch", "%DLQ%gone") in core.groups
        await admin.delete_group(core, pb.DeleteGroupRequest(group="dlq-watch"), pb.DeleteGroupResponse())
        await core.retention.run()
        assert sorted(core.topics) == ["t"]


async def test_a_letter_dead_lettered_while_the_topic_is_dropped_stays(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, store):
        await dead_letter(core, "gone")
        await admin.delete_group(core, pb.DeleteGroupRequest(group="gone"), pb.DeleteGroupResponse())
        clock.now = T0 + 2 * HOUR_MS
        submit, in_window = store.submit, asyncio.Event()

        def slow_submit(appends: Any, ops: Any, **kw: Any) -> Any:  # the drop's empty commit, as a slow fsync
            done = submit(appends, ops, **kw)
            if appends or ops or in_window.is_set():
                return done
            in_window.set()

            async def later() -> Any:
                result = await done
                await asyncio.sleep(0.2)
                return result

            return asyncio.ensure_future(later())

        store.submit = slow_submit  # type: ignore[method-assign]
        retention = asyncio.ensure_future(core.retention.run())
        await in_window.wait()
        store.submit = submit  # type: ignore[method-assign]
        await dead_letter(core, "gone")  # the group made again dead-letters while the drop waits
        assert await retention == 0
        assert core.topics["%DLQ%gone"].queues[0].max_offset == 2
        letters = (await core.pop("%DLQ%gone", "reader", "*", 2, 30_000, 0)).messages
        assert [letter.offset for letter in letters] == [0, 1]  # the new letter can be read


async def test_a_dlq_topic_dlq_resend_read_goes_once_its_letters_expired(tmp_path: Path) -> None:
    """`popgate dlq resend` leaves its group's state on the topics it read (deleting that group would re-send letters
    twice): with none of their letters in flight it does not keep a deleted group's DLQ topic; holding one, it does."""
    clock = ManualClock(T0)
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
        for group in ("resent", "held"):
            await dead_letter(core, group)
            [letter] = (await core.pop(f"%DLQ%{group}", "popgate-dlq-resend", "*", 1, 3 * HOUR_MS, 0)).messages
            if group == "resent":
                assert await core.ack(f"%DLQ%{group}", "popgate-dlq-resend", [letter.handle]) == [None]
            await admin.delete_group(core, pb.DeleteGroupRequest(group=group), pb.DeleteGroupResponse())
        clock.now = T0 + 2 * HOUR_MS
        await core.retention.run()
        assert "%DLQ%resent" not in core.topics and "%DLQ%held" in core.topics


async def test_a_letter_dlq_resend_left_and_gave_back_does_not_keep_the_topic(tmp_path: Path) -> None:
    """A letter `dlq resend` could not re-send (its topic gone) is given back: waiting, not held, so the deleted
    group's DLQ topic still goes once its letters expired."""
    clock = ManualClock(T0)
    async with broker(tmp_path, clock=clock, **SETTINGS) as (core, _):
        await dead_letter(core, "g")
        await admin.delete_topic(core, pb.DeleteTopicRequest(topic="t"), pb.DeleteTopicResponse())
        [letter] = (await core.pop("%DLQ%g", "popgate-dlq-resend", "*", 1, 30_000, 0)).messages
        await core.change_invisible("%DLQ%g", "popgate-dlq-resend", letter.handle, 0)
        await asyncio.sleep(0.05)  # its deadline passes: given back
        clock.now = T0 + 2 * HOUR_MS
        await core.retention.run()
        assert "%DLQ%g" not in core.topics
