"""test_model.py's delivery rules: what a group may read; Sends, Pops, held Pops and Notifications checked."""

from __future__ import annotations

import asyncio

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import rule
from popgate_pb import broker_pb2 as pb

from broker.model import PopResult, stable_hash
from broker.pop import redeliveries_first
from tests.unit.broker.model_machine import ModelMachine
from tests.unit.broker.model_state import (
    GROUPS,
    INVISIBLE_MS,
    MESSAGE_GROUPS,
    QUEUES,
    TAGS,
    TOPIC,
    Flight,
    GroupModel,
    Msg,
    filter_matches,
)


class DeliveryRules(ModelMachine):
    # -- what a group may read -------------------------------------------------

    def _fifo_in_flight(self, g: GroupModel, q: int) -> list[Msg]:
        return [self.msgs[b] for b in g.inflight if self.msgs[b].fifo and self.msgs[b].queue == q]

    def _blocked(self, g: GroupModel, m: Msg) -> str:
        """Whether a new message is held back by a FIFO message in flight to the group: "yes", "no", or "maybe"
        (a FIFO message the group's filter skips lies before it: whether the pull offset passed it is the
        broker's business)."""
        if not self._fifo_in_flight(g, m.queue):
            return "no"
        answer = "no"
        assert m.offset is not None
        passed = max(
            (self.msgs[b].offset or 0 for b in self.queues[m.queue] if g.status(b) != "new"),
            default=g.start[m.queue] - 1,
        )
        for b in self.queues[m.queue][: m.offset + 1]:
            f = self.msgs[b]
            if f.fifo and g.status(b) == "new":
                if (f.offset or 0) < max(g.start[m.queue], self.first[m.queue]):
                    continue
                if filter_matches(g.name, f.tag):
                    return "yes"
                if (f.offset or 0) > passed:
                    answer = "maybe"
        return answer

    def _redelivery_turn(self, g: GroupModel, m: Msg, taking: set[bytes]) -> bool:
        """A FIFO redelivery waits for every in-flight FIFO message before it in its queue (unless taken with it),
        and for every one after it that a consumer still holds (its invisibility not passed)."""
        if not m.fifo:
            return True
        assert m.offset is not None
        return all(
            f.body == m.body
            or ((f.offset or 0) < m.offset and f.body in taking)
            or ((f.offset or 0) > m.offset and not self._held(g, f.body))
            for f in self._fifo_in_flight(g, m.queue)
        )

    def _held(self, g: GroupModel, body: bytes) -> bool:
        """In flight to a consumer of the group, its invisibility not passed."""
        return g.inflight[body].deadline_ms > self.now

    def _deliverable(self, g: GroupModel) -> tuple[list[bytes], list[bytes], list[bytes]]:
        """(redeliveries ready, new messages certainly readable, new messages maybe readable) now."""
        redeliveries, certain, maybe = [], [], []
        for q in range(QUEUES):
            for b in self.queues[q]:
                m = self.msgs[b]
                if not self._relevant(g, m):
                    continue
                status = g.status(b)
                if status == "inflight" and g.inflight[b].deadline_ms <= self.now:
                    if self._redelivery_turn(g, m, set()):
                        redeliveries.append(b)
                elif status == "new":
                    blocked = self._blocked(g, m)
                    if blocked == "no":
                        certain.append(b)
                    elif blocked == "maybe":
                        maybe.append(b)
        return redeliveries, certain, maybe

    # -- rules -----------------------------------------------------------------

    @rule(
        kinds=st.lists(
            st.tuples(
                st.sampled_from(["normal", "fifo", "fifo", "delayed", "level"]),
                st.sampled_from(TAGS),
                st.sampled_from(MESSAGE_GROUPS),
                st.sampled_from([1, 500, 2_000, 20_000]),
            ),
            min_size=1,
            max_size=3,
        )
    )
    def send(self, kinds: list[tuple[str, str | None, str, int]]) -> None:
        messages, expected = [], []
        for kind, tag, message_group, delay_ms in kinds:
            body = self._new_body()
            m = pb.Message(topic=TOPIC, body=body)
            if tag is not None:
                m.tag = tag
            group = None
            due = None
            if kind == "fifo":
                m.message_group = group = message_group
            elif kind == "delayed":
                m.deliver_at_ms = due = self.now + delay_ms
            elif kind == "level":
                level = 1 + delay_ms % 3  # 1 s, 5 s, 10 s
                m.delay_level = level
                due = self.now + [1_000, 5_000, 10_000][level - 1]
            messages.append(m)
            expected.append(Msg(body, tag, group, -1, due))
        sent = self.run(self.core.send(messages))
        self.topic_exists = True
        for s, msg in zip(sent, expected, strict=True):
            msg.queue = s.queue_id
            assert 0 <= s.queue_id < QUEUES
            if msg.fifo:
                assert msg.message_group is not None
                assert s.queue_id == stable_hash(msg.message_group) % QUEUES, "a message group keeps to one queue"
            self.msgs[msg.body] = msg
            if msg.due_ms is None:
                assert s.offset == len(self.queues[s.queue_id]), "offsets of a queue are dense"
                assert s.due_ms is None
                msg.offset, msg.store_ms = s.offset, self.now
                self.queues[s.queue_id].append(msg.body)
                self._arrived()
            else:
                assert s.offset == -1 and s.due_ms == msg.due_ms, "a scheduled message has no offset yet"
        self.since_drain += len(messages)
        self._settle()

    def _pop(self, g: GroupModel, want: int, invisible_ms: int) -> PopResult:
        before = self._before_pop(g)
        result = self.run(self.core.pop(TOPIC, g.name, GROUPS[g.name], want, invisible_ms, 0))
        self._look(g)
        self._check_pop(g, want, invisible_ms, result, before)
        return result

    def _before_pop(self, g: GroupModel) -> tuple[list[bytes], dict[int, set[bytes]]]:
        redeliveries, _, _ = self._deliverable(g)
        return redeliveries, {q: {m.body for m in self._fifo_in_flight(g, q)} for q in range(QUEUES)}

    def _check_pop(
        self,
        g: GroupModel,
        want: int,
        invisible_ms: int,
        result: PopResult,
        before: tuple[list[bytes], dict[int, set[bytes]]],
        *,
        complete: bool = True,
    ) -> None:
        """The answer is one the model allows, and the model takes it. `complete`: a short answer left nothing
        ready (not for a held Pop, answered at the first thing that became ready while more came after it)."""
        before_redeliveries, fifo_before = before
        assert len(result.messages) <= want
        taken = [pb.Message.FromString(p.payload).body for p in result.messages]
        assert len(set(taken)) == len(taken), f"one message twice in one answer: {taken}"
        taking = set(taken)
        new_taken = []
        for p, body in zip(result.messages, taken, strict=True):
            m = self.msgs[body]
            where = f"{body!r} (queue {m.queue}, offset {m.offset}) to {g.name}"
            assert m.offset is not None, f"{where}: delivered before its delivery time"
            assert (p.queue_id, p.offset) == (m.queue, m.offset), f"{where}: answered as {p.queue_id}/{p.offset}"
            assert p.store_ms == m.store_ms
            assert self._relevant(g, m), f"{where}: tag {m.tag!r} ({GROUPS[g.name]!r}), start {g.start}"
            assert p.invisible_until_ms == self.now + invisible_ms
            status = g.status(body)
            if status == "new":
                assert p.attempt == 1, f"{where}: first delivery with attempt {p.attempt}"
                assert self._blocked(g, m) != "yes", (
                    f"{where}: delivered while a FIFO message of its queue is in flight"
                )
                earlier = [b for b in self.queues[m.queue][: m.offset] if self._relevant(g, self.msgs[b])]
                skipped = [b for b in earlier if g.status(b) == "new" and b not in taking]
                assert not skipped, f"{where}: delivered before the earlier {skipped} of its queue"
                new_taken.append(body)
            elif status == "inflight":
                flight = g.inflight[body]
                assert flight.deadline_ms <= self.now, f"{where}: delivered again while in flight (invisible)"
                assert p.attempt == flight.attempt + 1, (
                    f"{where}: redelivery attempt {p.attempt} after {flight.attempt}"
                )
                if m.fifo:
                    waiting = {b for b in fifo_before[m.queue] if (self.msgs[b].offset or 0) < m.offset} - taking
                    assert not waiting, f"{where}: FIFO redelivery ahead of the in-flight {waiting} before it"
                    held = {
                        b for b in fifo_before[m.queue] if (self.msgs[b].offset or 0) > m.offset and self._held(g, b)
                    }
                    assert not held, f"{where}: FIFO redelivery while {held} after it is still held by a consumer"
            else:
                raise AssertionError(f"{where}: delivered again although {status}")
        if any(self.msgs[b].fifo for b in taken):
            event("FIFO message delivered")
        if any(p.attempt > 1 for p in result.messages):
            event("redelivery")
        if new_taken and redeliveries_first(self.core.groups[(g.name, TOPIC)].pops):
            # a pass that takes redeliveries first (one in five; the others take new messages first: docs/BROKER.md)
            left = [b for b in before_redeliveries if b not in taking]
            assert not left, f"new messages {new_taken} went before ready redeliveries {left}"
        for p, body in zip(result.messages, taken, strict=True):
            g.inflight[body] = Flight(p.attempt, p.handle, p.invisible_until_ms)
            g.handles.append(p.handle)
            g.delivered_once.add(body)
        if complete and len(taken) < want:
            redeliveries, certain, _ = self._deliverable(g)
            assert not redeliveries and not certain, (
                f"pop of {want} answered {len(taken)} to {g.name} and left ready {redeliveries} / {certain}"
            )

    @rule(group=st.sampled_from(sorted(GROUPS)), want=st.integers(1, 4), invisible_ms=st.sampled_from(INVISIBLE_MS))
    def pop(self, group: str, want: int, invisible_ms: int) -> None:
        self._pop(self.groups[group], want, invisible_ms)
        self._settle()

    @rule(
        group=st.sampled_from(sorted(GROUPS)),
        tag=st.sampled_from(TAGS),
        wake=st.sampled_from(["send", "advance", "ack"]),
    )
    def held_pop(self, group: str, tag: str | None, wake: str) -> None:
        """A long-polling Pop held while nothing is ready is answered as soon as a send, an invisibility deadline
        or an ack (releasing a FIFO queue) makes something ready for it (notify-on-arrival, no sweep here)."""
        g = self.groups[group]
        redeliveries, certain, maybe = self._deliverable(g)
        if redeliveries or certain or maybe or not self.topic_exists:
            return
        task = self.loop.create_task(self.core.pop(TOPIC, group, GROUPS[group], 4, 5_000, 10_000))
        self.run(asyncio.sleep(0.005))
        assert not task.done(), f"a Pop of {group} with nothing ready was answered at once: {task.result()}"
        self._look(g)
        if wake == "send":
            self.send([("normal", tag, MESSAGE_GROUPS[0], 1)])
        elif wake == "advance":
            deadlines = [f.deadline_ms for f in g.inflight.values() if f.deadline_ms > self.now]
            self.now = min(deadlines, default=self.now + 1_000)
            self._settle()
        else:
            fifo = [f.handle for b, f in g.inflight.items() if self.msgs[b].fifo]
            if fifo:
                assert self.run(self.core.ack(TOPIC, group, fifo[:1])) == [None]
                body = self._current(g, fifo[0])
                assert body is not None
                del g.inflight[body]
                g.acked.add(body)
            self._settle()
        before = self._before_pop(g)
        redeliveries, certain, maybe = self._deliverable(g)
        if redeliveries or certain:
            done, _ = self.run(asyncio.wait({task}, timeout=2))
            assert done, f"a held Pop of {group} was not woken: {redeliveries} / {certain} ready"
        else:
            self.run(asyncio.sleep(0.005))
        if not task.done():
            task.cancel()
            self.run(asyncio.wait({task}))
            assert not (redeliveries or certain)
            return
        result = task.result()
        event(f"held pop woken by {wake}")
        if not maybe:
            assert result.messages, f"a held Pop of {group} answered empty before its poll time"
        self._check_pop(g, 4, 5_000, result, before, complete=False)
        self._settle()

    @rule(group=st.sampled_from(sorted(GROUPS)))
    def notification(self, group: str) -> None:
        g = self.groups[group]
        has, full = self.run(self.core.notification(TOPIC, group, GROUPS[group], 0))
        self._look(g)
        assert not full
        redeliveries, certain, maybe = self._deliverable(g)
        if redeliveries or certain:
            assert has, f"Notification of {group}: no message, but {redeliveries} / {certain} are ready"
        elif not maybe:
            assert not has, f"Notification of {group}: has_message, but nothing is ready"
        self._settle()
