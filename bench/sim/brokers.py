"""The simulated broker: messages, the calls it receives, held requests and the wake rule of `broker.longpoll`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.sim.model import Sim


@dataclass(slots=True)
class Msg:
    ident: int
    broker: int
    acked: float  # when the producer had the Send ack
    stored: float  # when the broker stored it (and woke waiters)


@dataclass(slots=True)
class Req:
    """One proxy -> broker call (Pop or Notification)."""

    kind: str  # "pop" | "notify"
    broker: int
    poll_s: float
    batch: int
    on_answer: Callable[[Req, list[Msg], bool, bool], None]  # (req, messages, has_message, polling_full)
    cancelled: bool = False
    held: bool = False
    answered: bool = False
    seq: int = 0  # when it was held, in the broker's arrival order (oldest woken first, whatever its kind)


class Broker:
    def __init__(self, sim: Sim, index: int) -> None:
        self.sim = sim
        self.index = index
        self.ready: deque[Msg] = deque()
        self.pops: deque[Req] = deque()  # held, oldest first (cancelled ones skipped lazily)
        self.notes: deque[Req] = deque()
        self.held_pops = 0
        self.held_notes = 0
        self.holds = 0  # requests held so far: the next one's seq
        self.rpcs = {"pop": 0, "notify": 0}

    def receive(self, req: Req) -> None:
        """A Pop or Notification arrives."""
        if req.cancelled:
            return
        self.rpcs[req.kind] += 1
        lat = self.sim.lat
        if req.kind == "pop":
            if self.ready:
                self._take(req)
                return
            if req.poll_s <= 0:
                self._answer(req, [], False, False, lat.pop_empty)
                return
        elif self.ready:
            self._answer(req, [], True, False, lat.pop_empty)
            return
        if self.held_pops + self.held_notes >= self.sim.cfg.max_held:
            self._answer(req, [], False, True, lat.pop_empty)
            return
        req.held = True
        req.seq = self.holds
        self.holds += 1
        if req.kind == "pop":
            self.pops.append(req)
            self.held_pops += 1
        else:
            self.notes.append(req)
            self.held_notes += 1
        self.sim.at(self.sim.now + req.poll_s, self._expire, req)

    def _unhold(self, req: Req) -> None:
        if req.held:
            req.held = False
            if req.kind == "pop":
                self.held_pops -= 1
            else:
                self.held_notes -= 1

    def _expire(self, req: Req) -> None:
        if req.held and not req.cancelled:
            self._unhold(req)
            self._answer(req, [], False, False, self.sim.lat.pop_empty)

    def cancel(self, req: Req) -> None:
        """The cancel frame arrives: drop the hold."""
        self._unhold(req)

    def _take(self, req: Req) -> None:
        n = min(req.batch, len(self.ready))
        msgs = [self.ready.popleft() for _ in range(n)]
        self._answer(req, msgs, True, False, self.sim.lat.pop_take)

    def _answer(self, req: Req, msgs: list[Msg], has: bool, full: bool, proc: float) -> None:
        req.answered = True
        sim = self.sim
        sim.at(sim.now + sim.sample(proc) + sim.sample(sim.lat.hop), sim.deliver, req, msgs, has, full)

    def _live(self, queue: deque[Req]) -> Req | None:
        while queue and (queue[0].cancelled or not queue[0].held):
            queue.popleft()
        return queue[0] if queue else None

    def append(self, msgs: list[Msg]) -> None:
        """New messages: wake one held request per message, oldest first whatever its kind (broker.longpoll._wake)."""
        self.ready.extend(msgs)
        budget = len(msgs)
        while budget > 0:
            pop, note = self._live(self.pops), self._live(self.notes)
            if note is not None and (pop is None or note.seq < pop.seq):
                self.notes.popleft()
                self._unhold(note)
                self._answer(note, [], True, False, self.sim.lat.pop_empty)
            elif pop is not None:
                if not self.ready:
                    break  # woken but nothing left: it holds again
                self.pops.popleft()
                self._unhold(pop)
                self._take(pop)
            else:
                break
            budget -= 1

    def sweep(self) -> None:
        """The 1 s safety sweep: wake every held request when something is ready."""
        if not self.ready:
            return
        for queue in (self.pops, self.notes):
            for req in list(queue):
                if req.held and not req.cancelled:
                    if req.kind == "pop":
                        if not self.ready:
                            break
                        self._unhold(req)
                        self._take(req)
                    else:
                        self._unhold(req)
                        self._answer(req, [], True, False, self.sim.lat.pop_empty)
            while queue and not queue[0].held:
                queue.popleft()
