"""Recall: a scheduled message withdrawn before it is due (RocketMQ 5.3's RecallMessage).

The Send of a scheduled message answers a recall handle (`popgate_contract.handles.RecallHandle`: this broker,
the topic, the schedule row and the message id). A recall that names a message still waiting for its time takes
it out of the schedule index at once (the deliverer can no longer take it) and deletes its row in one commit: it
is never delivered, also after a kill -9 or when the caller goes away during the commit. A message already taken
for delivery, delivered or recalled is refused with NotScheduled; a handle that is not one, or names another
broker, topic or message, with InvalidRecallHandle; either way nothing changes — tests/unit/broker/test_recall.py.
"""

from __future__ import annotations

import asyncio
import functools

from popgate_pb import broker_pb2 as pb

from broker.send import SendPath
from broker.store import DeleteScheduled, PutScheduled, Record
from popgate_contract.errors import InvalidRecallHandle, NotScheduled
from popgate_contract.handles import RecallHandle


async def recall(sends: SendPath, topic: str, text: str) -> str:
    """Withdraw the scheduled message `text` names; its message id."""
    handle = RecallHandle.decode(text)
    if handle.broker != sends.name:
        raise InvalidRecallHandle(f"recall handle belongs to broker {handle.broker}, not {sends.name}")
    if topic and handle.topic != topic:
        raise InvalidRecallHandle(f"recall handle is for topic {handle.topic}, not {topic}")
    row = await _row(sends, handle)
    if row.topic != handle.topic or pb.Message.FromString(row.payload).message_id != handle.message_id:
        raise InvalidRecallHandle("recall handle does not name the message scheduled under it")
    if not sends.schedule.waiting(handle.schedule_id):  # taken for delivery while the row was read
        raise _not_scheduled(handle)
    sends.schedule.remove(handle.schedule_id)
    committed = sends.submit([], [DeleteScheduled(handle.schedule_id)], awaited=True)
    # What the commit did is settled by the commit, also when the caller is cancelled meanwhile —
    # tests/unit/broker/test_recall.py::test_a_recall_cancelled_during_its_commit_still_takes_effect.
    committed.add_done_callback(functools.partial(_recalled, sends, row))
    await asyncio.shield(committed)
    return handle.message_id


def _recalled(sends: SendPath, row: PutScheduled, committed: asyncio.Future[list[Record]]) -> None:
    if committed.cancelled() or committed.exception() is not None:
        sends.schedule.add(row.due_ms, row.schedule_id)  # not deleted: it waits for its time again
        sends.scheduler.added(row.due_ms)
    else:
        sends.forget_scheduled(row.schedule_id)


async def _row(sends: SendPath, handle: RecallHandle) -> PutScheduled:
    if not sends.schedule.waiting(handle.schedule_id):
        raise _not_scheduled(handle)
    rows = await sends.scheduled_rows([handle.schedule_id])
    if not rows:
        raise _not_scheduled(handle)
    return rows[0]


def _not_scheduled(handle: RecallHandle) -> NotScheduled:
    return NotScheduled(
        f"message {handle.message_id} of topic {handle.topic} is not waiting for its delivery time: delivered, being"
        " delivered, or recalled already"
    )
