"""test_model.py's machine: a `BrokerCore` driven at the model's time, the model kept up with what fell due."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize
from popgate_pb import broker_pb2 as pb

from broker.core import BrokerCore
from tests.unit.broker import cores
from tests.unit.broker.model_state import (
    GROUPS,
    MAX_ATTEMPTS,
    QUEUES,
    RETENTION_MS,
    START_MS,
    TOPIC,
    GroupModel,
    Msg,
    T,
    filter_matches,
    run_with,
)


class ModelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = cores.ManualClock(START_MS)  # the broker's: the model's time
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="popgate-model-"))
        self.msgs: dict[bytes, Msg] = {}
        self.queues: list[list[bytes]] = [[] for _ in range(QUEUES)]  # appended bodies in offset order
        self.groups = {name: GroupModel(name) for name in GROUPS}
        self.topic_exists = False
        self.first = [0] * QUEUES  # each queue's first kept offset (retention deletes below)
        self.counter = 0
        self.since_drain = 0
        self.stack: AsyncExitStack | None = None
        self.flush = "async"
        self.data = self.dir / "data"
        self.images = 0
        self.consume_from = "earliest"
        self.core: BrokerCore

    @initialize(flush=st.sampled_from(["async", "sync"]), consume_from=st.sampled_from(["earliest", "latest"]))
    def open_broker(self, flush: str, consume_from: str) -> None:
        """--flush async answers Pops, Acks and ChangeInvisibleTimes before their commit, sync after it;
        --consume-from: where a new group starts."""
        self.flush, self.consume_from = flush, consume_from
        self._open()

    # -- plumbing --------------------------------------------------------------

    @property
    def now(self) -> int:
        return self.clock.now

    @now.setter
    def now(self, ms: int) -> None:
        self.clock.now = ms

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_with(self.loop, coro)

    def _open(self) -> BrokerCore:
        async def open_() -> BrokerCore:
            self.stack = AsyncExitStack()
            core, _ = await self.stack.enter_async_context(
                cores.broker(
                    self.data,
                    flush=self.flush,
                    consume_from=self.consume_from,
                    max_delivery_attempts=MAX_ATTEMPTS,
                    queues_per_topic=QUEUES,
                    retention_s=RETENTION_MS / 1000,
                    clock=self.clock,
                )
            )
            return core

        core = self.run(open_())
        self.core = core
        self._settle()
        return core

    def _close(self) -> None:
        if self.stack is not None:
            stack, self.stack = self.stack, None
            self.run(stack.aclose())

    def teardown(self) -> None:
        try:
            self._close()
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _fire_due_timers(self) -> bool:
        """Run the broker's armed invisibility timers whose deadline the model's time has reached."""
        redelivery = self.core.redelivery
        fired = False
        for key, (deadline, handle) in list(redelivery._timers.items()):
            if deadline <= self.now and redelivery._timers.get(key, (None, None))[1] is handle:
                handle.cancel()
                del redelivery._timers[key]
                redelivery._on_deadline(self.core.groups[key])
                fired = True
        return fired

    def _settle(self) -> None:
        """Let the broker do what is due at the model's time: timers, dead-letter moves, scheduled deliveries;
        then bring the model up to the same time."""

        async def settle() -> None:
            for _ in range(2000):
                fired = self._fire_due_timers()
                self.core.scheduler.added(0)
                await asyncio.sleep(0)
                redelivery = self.core.redelivery
                busy = redelivery._tasks or redelivery._to_dlq or self.core.scheduler.due_pending()
                if not fired and not busy:
                    return
                await asyncio.sleep(0.001)
            raise AssertionError("the broker did not settle: timers, dead letters or scheduled deliveries pending")

        self.run(settle())
        self._model_expire()
        self._model_arrivals()

    def _model_expire(self) -> None:
        for g in self.groups.values():
            for body, flight in list(g.inflight.items()):
                if flight.deadline_ms <= self.now and flight.attempt >= MAX_ATTEMPTS:
                    event("dead-lettered at the last attempt")
                    del g.inflight[body]
                    g.dlq[body] = flight.attempt

    def _model_arrivals(self) -> None:
        """Delayed messages due by now are in their queue, each once, stored now."""
        for q in range(QUEUES):
            due = {
                m.body
                for m in self.msgs.values()
                if m.queue == q and m.offset is None and m.due_ms is not None and m.due_ms <= self.now
            }
            known = len(self.queues[q])
            records = self.run(self.core.list_messages(TOPIC, q, known, 1000)) if self.topic_exists else []
            bodies = [pb.Message.FromString(r.payload).body for r in records]
            assert sorted(bodies) == sorted(due), f"queue {q}: appended {bodies}, due {sorted(due)}"
            for r, body in zip(records, bodies, strict=True):
                assert r.offset == len(self.queues[q]), "offsets of a queue are dense"
                assert r.store_ms == self.now, "a delayed message is stored when it is delivered"
                self.msgs[body].offset = r.offset
                self.msgs[body].store_ms = r.store_ms
                self.queues[q].append(body)
                self._arrived()

    def _arrived(self) -> None:
        for g in self.groups.values():
            if g.looked_early:  # its state is made when the topic's first messages arrive (docs/BROKER.md)
                g.looked, g.looked_early = True, False

    def _look(self, g: GroupModel) -> None:
        """A Pop or Notification of the group. Its first look at the existing topic fixes where it starts: under
        `latest` after the queue's last message, unless it looked before the topic existed (docs/BROKER.md, "New
        groups")."""
        if self.topic_exists:
            if not g.looked and self.consume_from == "latest":
                g.start = [len(q) for q in self.queues]
            g.looked = True
        elif not g.looked:
            g.looked_early = True

    def _relevant(self, g: GroupModel, m: Msg) -> bool:
        """The group reads the message: its filter matches, it is not before where the group started, and
        retention did not delete it before the group received it."""
        if m.offset is not None and m.offset < self.first[m.queue] and g.status(m.body) == "new":
            return False
        return filter_matches(g.name, m.tag) and (m.offset is None or m.offset >= g.start[m.queue])

    def _new_body(self) -> bytes:
        self.counter += 1
        return b"m%d" % self.counter
