"""A stored row that fails to read with an I/O error (a bad sector under it: SQLITE_IOERR, not a page SQLite finds
corrupt) costs only its own messages: the others of the Pop are served, its messages are dead-lettered as
unreadable, and the group goes on; a store that cannot be read at all fails the Pop uncharged
(test_pop_order.py::test_a_pop_the_store_cannot_read_charges_no_attempt). Real SQLite store, the I/O error
injected where the store reads a queue's rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as pb

from broker import handlers, store_reads
from tests.unit.broker.cores import broker

BAD = (0, 0)  # (queue, offset) on the bad sector


async def test_a_row_with_an_io_error_costs_only_its_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    async with broker(data, queues_per_topic=4) as (core, _):
        await core.send([pb.Message(topic="t", body=b"m%d" % i, queue_id=i % 4) for i in range(40)])
    real = store_reads.read_queue

    def read_queue(conn: Any, ends: Any, topic: str, queue_id: int, offsets: Any, out: Any) -> None:
        if topic == "t" and queue_id == BAD[0] and BAD[1] in offsets:
            error = sqlite3.OperationalError("disk I/O error")
            error.sqlite_errorcode = sqlite3.SQLITE_IOERR_READ  # type: ignore[attr-defined]
            raise error
        real(conn, ends, topic, queue_id, offsets, out)

    monkeypatch.setattr(store_reads, "read_queue", read_queue)
    async with broker(data, queues_per_topic=4) as (core, _):  # restarted: nothing of the row is cached
        received: list[bytes] = []
        for _ in range(12):
            answer = pb.PopResponse()  # as the broker answers: none fails
            await handlers.pop(core, pb.PopRequest(topic="t", group="g", max_messages=8, invisible_ms=30_000), answer)
            received += [m.stored.message.body for m in answer.messages]
            if answer.messages:
                await core.ack("t", "g", [m.receipt_handle for m in answer.messages])
        assert sorted(received) == sorted(b"m%d" % i for i in range(1, 40))
        assert core.groups[("g", "t")].dead_lettered == 1  # m0, as unreadable
