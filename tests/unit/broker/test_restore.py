"""A broker starts on whatever it stored: state a request was allowed to create never stops the next start."""

from __future__ import annotations

import logging
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from tests.unit.broker.cores import ManualClock, broker

TWO_LETTER_TAGS = [a + b for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz"][:256]


async def test_a_group_with_the_longest_legal_filter_restarts_and_keeps_its_filter(tmp_path: Path) -> None:
    """A review's broker exited at start with IllegalFilter after a Pop with a compact 1,022-character filter: it
    was stored as 1,532 characters (" || " between tags) and read back against the 1,024-character limit."""
    expression = "||".join(TWO_LETTER_TAGS)
    assert len(expression) == 1022

    async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, _):
        await core.send([pb.Message(topic="t", body=b"x", tag=tag) for tag in ("aa", "zz", "ab", "zz")])
        popped = await core.pop("t", "g", expression, 1, 30_000, 0)
        assert len(popped.messages) == 1
    async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, _):
        [row] = core.lags("t", "g")  # with the stored filter: "aa" in flight and "ab", not the two "zz"
        popped = await core.pop("t", "g", expression, 32, 30_000, 0)
    assert (row.lag.lag, len(popped.messages)) == (2, 1)


async def test_a_stored_filter_that_cannot_be_parsed_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="broker.core"):
        async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, _):
            await core.send([pb.Message(topic="t", body=b"x", tag=tag) for tag in ("a", "b")])
            await core.pop("t", "g", "a", 1, 30_000, 0)
        with (
            closing(sqlite3.connect(tmp_path / "broker.sqlite3")) as conn,
            conn,
        ):  # as another version might have written it
            conn.execute("UPDATE group_filters SET expression = 'a || | b'")
        async with broker(tmp_path, queues_per_topic=1, flush="sync") as (core, _):
            [row] = core.lags("t", "g")  # the group is still there, reading as '*' until its next Pop
        assert row.lag.lag == 2  # the one in flight and "b"
    assert any("stored filter of group g on topic t skipped" in r.getMessage() for r in caplog.records)


async def test_a_delivery_restored_after_the_clock_went_back_is_invisible_no_longer_than_the_longest_pop(
    tmp_path: Path,
) -> None:
    """A stored deadline is wall time: restored after the wall clock went back an hour, it is cut to
    `max_invisible_s` from now, so the message is delivered again by then, not an hour late."""
    clock = ManualClock(1_800_000_000_000)
    async with broker(tmp_path, clock=clock, queues_per_topic=1, max_invisible_s=60.0) as (core, _):
        await core.send([pb.Message(topic="t", body=b"m1")])
        assert len((await core.pop("t", "g", "*", 1, 2_000, 0)).messages) == 1
    clock.step(-3_600_000)
    async with broker(tmp_path, clock=clock, queues_per_topic=1, max_invisible_s=60.0) as (core, _):
        clock.now += 59_999
        assert (await core.pop("t", "g", "*", 1, 2_000, 0)).messages == []
        clock.now += 1
        (again,) = (await core.pop("t", "g", "*", 1, 2_000, 0)).messages
    assert again.attempt == 2
