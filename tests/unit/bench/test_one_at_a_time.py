"""bench.one_at_a_time's wake loop: it counts empty receives and ends when the producer fails or time runs out."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from bench.one_at_a_time import wake_loop


@dataclass
class Body:
    body: bytes


@dataclass
class FakeConsumer:
    """Answers each receive with the next batch of `answers` (then nothing), after a short wait."""

    answers: list[list[Body]]
    acked: list[Body] = field(default_factory=list)

    async def receive(self, max: int, wait: float) -> list[Body]:
        await asyncio.sleep(0.001)
        return self.answers.pop(0) if self.answers else []

    async def ack_many(self, messages: list[Body]) -> None:
        self.acked += messages


@dataclass
class FakeProducer:
    returncode: int | None = None


def sent() -> Body:
    return Body(b"%d x" % time.monotonic_ns())


def test_empty_receives_are_counted_and_the_warm_up_is_not_a_wake() -> None:
    consumer = FakeConsumer([[Body(b"0 warm-up")], [], [sent()], [], [], [sent(), sent()]])
    woke = asyncio.run(wake_loop(consumer, FakeProducer(), 3, 10))
    assert (len(woke.ms), woke.empties, len(consumer.acked)) == (3, 3, 4)


def test_a_producer_that_failed_ends_the_loop() -> None:
    consumer: Any = FakeConsumer([[sent()]])
    with pytest.raises(RuntimeError, match="the producer exited with status 1 after 1 of 5 wakes"):
        asyncio.run(wake_loop(consumer, ProducerFailingAfter(2), 5, 10))


def test_a_producer_that_stopped_early_ends_the_loop_at_the_next_empty_receive() -> None:
    consumer = FakeConsumer([[sent()], [sent()]])
    with pytest.raises(RuntimeError, match="the producer exited and a receive after that came back empty: 2 of 6"):
        asyncio.run(wake_loop(consumer, FakeProducer(returncode=0), 6, 10))


def test_the_loop_ends_at_its_deadline() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"0 of 5 wakes in 0.2 s \(\d+ empty receives\)"):
        asyncio.run(wake_loop(FakeConsumer([]), FakeProducer(), 5, 0.2))
    assert time.monotonic() - started < 2


class ProducerFailingAfter:
    """A producer process whose returncode is read as running `n` times, then 1 (it crashed)."""

    def __init__(self, n: int) -> None:
        self.reads = n

    @property
    def returncode(self) -> int | None:
        self.reads -= 1
        return None if self.reads >= 0 else 1
