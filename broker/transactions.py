"""Transactions: half messages kept apart until their producer resolves them (RocketMQ 5's TRANSACTION type).

- A Send of a transactional message stores it in `half_messages`, not in its topic, and answers a transaction
  id (`popgate_contract.handles.TransactionId`: this broker, the row and a random token). No consumer sees it.
- EndTransaction COMMIT appends it to its topic and deletes its row in one commit, ROLLBACK deletes the row: a
  half message is resolved once, also across a kill -9 (its row and the append are one transaction), and also
  when its caller goes away meanwhile (the commit and what it changes in memory are not cancelled with it). A
  transaction id that is not one, names another broker or topic, or has the wrong token (forged) is refused with
  InvalidTransactionId and changes nothing. The same resolution sent again (a client whose answer was lost) is
  answered as the first: it waits for the first one under way, and is OK once it is done, as long as it is among
  the last `RESOLVED_KEPT` resolutions (in memory, not across a restart; a roll-back after the last check counts
  as a ROLLBACK); the other resolution is refused (InvalidTransactionId).
- Checks (`CheckSchedule`): a proxy asks for the due checks of the topics its producers publish to
  (`TransactionChecks`) and sends each to one of those producers (a RecoverOrphanedTransactionCommand); each
  check handed out is stored (count, next time) before it is answered, so a restart neither forgets a check
  nor hands one out twice within the interval. After the last check, or past its time, the broker rolls the
  half message back itself (from the sweep, at most `sweep_interval_s` late).
- The schedule runs on the broker's monotonic clock: a half message enters it with its age and the time to its
  next check as the wall clock says then (its store time, its stored next check), and from there a step of the
  wall clock neither rolls it back nor moves its checks — tests/unit/broker/test_transactions.py::
  test_a_wall_clock_step_while_running_neither_rolls_a_half_message_back_nor_moves_its_checks. What is stored, and
  answered (`next_due_ms`), is wall time.

tests/unit/broker/test_transactions.py, tests/integration/broker/test_transactions.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from popgate_pb import broker_pb2 as pb

from broker.clock import Clock
from broker.inflight import tokens
from broker.send import SendPath, remembered_queue
from broker.settings import BrokerSettings
from broker.store import DeleteHalf, NewMessage, Op, PutHalf, SetHalfCheck
from broker.txcheck import CheckSchedule, Half
from popgate_contract.errors import InvalidTransactionId
from popgate_contract.handles import TransactionId

log = logging.getLogger(__name__)
MAX_CHECKS_PER_CALL = 256
RESOLVED_KEPT = 4096  # resolutions remembered so that the same one sent again is answered OK (`end`)


@dataclass(slots=True)
class TransactionStats:
    committed: int = 0
    rolled_back: int = 0  # by their producer (or its checker)
    expired: int = 0  # rolled back by the broker after the last check
    checks: int = 0


@dataclass(slots=True)
class Check:
    row: PutHalf
    transaction_id: str
    check: int


class Transactions:
    def __init__(self, settings: BrokerSettings, sends: SendPath, *, clock: Clock) -> None:
        self.name = settings.name
        self.sends = sends
        self.clock = clock
        self.schedule = CheckSchedule(
            immunity_ms=round(settings.transaction_immunity_s * 1000),
            interval_ms=round(settings.transaction_check_interval_s * 1000),
            max_checks=settings.transaction_max_checks,
            started_ms=clock.monotonic_ms(),
        )
        self.stats = TransactionStats()
        self._next_id = 0
        self._offset_ms: int | None = None  # wall time less monotonic time (`_offset`)
        self._expiring: set[asyncio.Task[None]] = set()
        # Resolutions under way: half id -> (commit, the task committing it), which a caller's cancel does not stop.
        self._ending: dict[int, tuple[bool, asyncio.Task[None]]] = {}
        # The last RESOLVED_KEPT resolutions: half id -> (token, topic, committed).
        self._resolved: OrderedDict[int, tuple[int, str, bool]] = OrderedDict()

    def restore(self, halves: Sequence[PutHalf]) -> None:
        for row in halves:
            self._added(row)
            self._next_id = max(self._next_id, row.half_id)

    def half(self, m: pb.Message, new: NewMessage, now_ms: int) -> tuple[PutHalf, str]:
        """The row of a new half message (stored by the Send's commit) and its transaction id."""
        self._next_id += 1
        token = tokens.getrandbits(48)
        first = self.schedule.first_check_ms(now_ms)
        row = PutHalf(self._next_id, token, m.topic, new.queue_id, new.tag, new.payload, now_ms, 0, first)
        return row, TransactionId(self.name, row.half_id, token).encode()

    def committed(self, ops: Sequence[Op]) -> None:
        """A Send's commit stored these half messages: they wait for their resolution from now on."""
        for op in ops:
            if isinstance(op, PutHalf):
                self._added(op)

    def _added(self, row: PutHalf) -> None:
        r, now, offset = row, self.clock.now_ms(), self._offset()
        stored, next_check = now - offset - max(0, now - r.store_ms), r.next_check_ms - offset  # monotonic
        self.schedule.add(Half(r.half_id, r.token, r.topic, r.queue_id, r.tag, stored, r.checks, next_check))

    def _offset(self) -> int:
        """Wall time less monotonic time. A change of 1 ms is the two clocks read a moment apart, not a step: the
        last offset stays, so a time stored as wall time and restored is answered as stored —
        tests/unit/broker/test_transactions.py::test_the_next_check_answered_is_the_one_stored_also_after_a_restart."""
        offset = self.clock.now_ms() - self.clock.monotonic_ms()
        if self._offset_ms is None or abs(offset - self._offset_ms) > 1:
            self._offset_ms = offset
        return self._offset_ms

    def _wall_ms(self, monotonic_ms: int) -> int:
        """A time of the schedule (0: none) as wall time now."""
        return monotonic_ms and monotonic_ms + self._offset()

    def _waiting(self, topic: str, tid: TransactionId, commit: bool) -> Half | None:
        """The half message `tid` names, waiting for its resolution; None when it was resolved as `commit` says
        already (recently: `_resolved`)."""
        half = self.schedule.get(tid.half_id) if tid.broker == self.name else None
        if half is None or half.token != tid.token or (topic and half.topic != topic):
            resolved = self._resolved.get(tid.half_id) if half is None and tid.broker == self.name else None
            if resolved is not None and resolved[0] == tid.token and (not topic or resolved[1] == topic):
                if resolved[2] == commit:
                    return None
                raise InvalidTransactionId(
                    f"the half message was {'committed' if resolved[2] else 'rolled back'} already"
                )
            raise InvalidTransactionId(
                "transaction id names no half message waiting for its resolution here (made up, or committed or"
                " rolled back already)"
            )
        return half

    async def end(self, topic: str, text: str, *, commit: bool) -> None:
        """Commit or roll back the half message `text` names. The resolution goes on when the caller is cancelled;
        the same resolution sent again waits for it, or is OK once done — tests/unit/broker/test_transactions.py::
        test_an_end_cancelled_during_its_commit_takes_effect_and_a_resend_is_answered_ok."""
        half = self._waiting(topic, TransactionId.decode(text), commit)
        if half is None:
            return
        ending = self._ending.get(half.half_id)
        if ending is not None and ending[0] == commit:
            await asyncio.shield(ending[1])
            return
        if half.busy:
            raise InvalidTransactionId("the half message is being committed or rolled back already")
        half.busy = True  # from here no other resolution, check or expiry takes it
        task = asyncio.get_running_loop().create_task(self._end(half, commit))
        self._ending[half.half_id] = (commit, task)
        task.add_done_callback(functools.partial(self._end_done, half.half_id))
        await asyncio.shield(task)

    def _end_done(self, half_id: int, task: asyncio.Task[None]) -> None:
        if (ending := self._ending.get(half_id)) is not None and ending[1] is task:  # not a later one's
            del self._ending[half_id]

    async def _end(self, half: Half, commit: bool) -> None:
        try:
            if commit:
                rows = await self.sends.store.read_halves([half.half_id])
                if not rows:
                    raise InvalidTransactionId("the half message is not stored any more")
                ops: list[Op] = []
                queue_id = remembered_queue(self.sends.topic_for_send(half.topic, ops, force=True), half.queue_id)
                append = NewMessage(half.topic, queue_id, self.clock.now_ms(), half.tag, rows[0].payload)
                committed = self.sends.submit([append], [*ops, DeleteHalf(half.half_id)])
            else:
                committed = self.sends.submit([], [DeleteHalf(half.half_id)], awaited=True)
        except BaseException:
            half.busy = False  # nothing submitted: it waits as before
            raise
        # What the commit did is settled by the commit, also when this task is cancelled meanwhile (at close).
        committed.add_done_callback(functools.partial(self._ended, half, commit))
        await asyncio.shield(committed)

    def _ended(self, half: Half, commit: bool, committed: asyncio.Future[object]) -> None:
        if committed.cancelled() or committed.exception() is not None:
            half.busy = False  # not resolved: it waits as before
            return
        self.schedule.remove(half.half_id)
        self._remember(half, commit)
        if commit:
            self.stats.committed += 1
        else:
            self.stats.rolled_back += 1

    def _remember(self, half: Half, committed: bool) -> None:
        self._resolved[half.half_id] = (half.token, half.topic, committed)
        if len(self._resolved) > RESOLVED_KEPT:
            self._resolved.popitem(last=False)

    async def checks(self, topics: Sequence[str], limit: int, *, asked: Sequence[str] = ()) -> tuple[list[Check], int]:
        """The due checks of these topics, each recorded (durably) before it is handed out; and when the next one
        of these topics falls due (0: none). The `asked` topics' checks are asked for too, none handed out now."""
        offset = self._offset()
        mono = self.clock.now_ms() - offset
        self.schedule.asked(asked, mono)
        halves = self.schedule.due(topics, mono, min(max(limit, 1), MAX_CHECKS_PER_CALL)) if topics else []
        if not halves:
            return [], self._wall_ms(self.schedule.next_due_ms(topics))
        for half in halves:
            half.checking = True
        try:
            states = [self.schedule.check_state(h, mono) for h in halves]
            rows = {r.half_id: r for r in await self.sends.store.read_halves([h.half_id for h in halves])}
            stored = [
                SetHalfCheck(h.half_id, count, next_ms + offset)
                for h, (count, next_ms) in zip(halves, states, strict=True)
            ]
            await self.sends.submit([], stored, awaited=True)
        finally:
            for half in halves:
                half.checking = False
        out = []
        for half, (count, next_ms) in zip(halves, states, strict=True):
            self.schedule.checked(half, count, next_ms)
            if half.half_id in rows and self.schedule.get(half.half_id) is not None:
                tid = TransactionId(self.name, half.half_id, half.token).encode()
                out.append(Check(rows[half.half_id], tid, count))
        self.stats.checks += len(out)
        return out, self._wall_ms(self.schedule.next_due_ms(topics))

    def expire(self) -> asyncio.Task[None] | None:
        """Roll back the half messages past their last check (the sweep calls this); the task doing it."""
        halves = self.schedule.expired(self.clock.now_ms() - self._offset())
        if not halves:
            return None
        for half in halves:
            half.busy = True
        task = asyncio.get_running_loop().create_task(self._roll_back(halves))
        self._expiring.add(task)
        task.add_done_callback(self._expiring.discard)
        return task

    async def _roll_back(self, halves: list[Half]) -> None:
        try:
            await self.sends.submit([], [DeleteHalf(h.half_id) for h in halves], awaited=True)
        except BaseException as exc:  # tried again at the next sweep (or the next start)
            log.warning("rolling back %d unresolved half messages failed: %r", len(halves), exc)
            for half in halves:
                half.busy = False
                self.schedule.add(half)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for half in halves:
            self.schedule.remove(half.half_id)
            self._remember(half, False)
        self.stats.expired += len(halves)
        log.info("rolled back %d half messages unresolved after their last check", len(halves))

    async def close(self) -> None:
        tasks = [*self._expiring, *(task for _, task in self._ending.values())]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
