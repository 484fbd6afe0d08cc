"""Discrete-event model of popgate receive: N brokers, M proxies, C consumers, one topic and group.

The proxies run the real sans-IO pieces — `proxy.receive.notify.NotifyRun` (pop with notify) and
`proxy.receive.adaptive.AdaptivePolicy` (the adaptive switch) — fed with simulated time; only the I/O is
modelled: one-way hops with lognormal jitter, broker processing, held requests, the wake rule of
`broker.longpoll` (one held request per new message, oldest first whatever its kind, plus the 1 s
safety sweep), the per-broker held limit (`polling_full`), and the consumers' processing time.

Everything is seeded: one `Sim(config)` → one result, bit for bit.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from popgate_contract.errors import DomainError
from proxy.receive.adaptive import LONGPOLL, AdaptivePolicy, AdaptiveSettings
from proxy.receive.notify import Cancel, Command, Finish, Notify, NotifyRun, Pop

GROUP = "g"


@dataclass(frozen=True, slots=True)
class Latency:
    """Median costs in seconds (each × `scale`, sampled lognormal with `sigma`); docs/SCALE.md has the calibration."""

    hop: float = 0.00035  # one gRPC message proxy <-> broker, one way
    proxy_step: float = 0.00025  # proxy: handle one broker answer / issue the next call
    pop_take: float = 0.0005  # broker: a Pop that takes messages (group-committed in-flight record)
    pop_empty: float = 0.0001  # broker: a Pop or Notification that finds nothing / holds
    store: float = 0.00133  # broker: Send commit (Send = hop + store + hop ~ 2.0 ms)
    answer: float = 0.00095  # proxy -> consumer: three stream frames
    request: float = 0.0005  # consumer -> proxy: ReceiveMessage arrives and is dispatched
    # The medians above were derived on 2026-11-21 06:42; the re-measurement of 08:36-08:44 found the broker Send
    # (hop + store + hop) 1.08 x slower at the median and wider (its quartiles to p95 fit sigma 0.3, was 0.25).
    scale: float = 1.08
    sigma: float = 0.3
    tail_p: float = 0.002  # probability that a step hits a scheduling stall (shared 2-core machine)
    tail_s: float = 0.002  # mean of that stall (exponential)


@dataclass(slots=True)
class Config:
    mode: str = "notify"  # notify | longpoll | adaptive
    brokers: int = 4
    proxies: int = 1
    consumers: int = 1
    rate: float = 10.0  # messages / s offered, whole topic
    arrivals: str = "uniform"  # poisson | uniform (50-250 ms gaps, sparse bench) | ticks (20 ms batches, dense bench)
    burst: float = 1.0  # >1: on/off modulation, rate × burst while on (on 1/burst of the time), 0 while off
    burst_period: float = 1.0
    skew: float = 0.0  # Zipf exponent of the broker a message goes to (0 = even)
    proxy_skew: float = 0.0  # Zipf exponent of the proxy a consumer connects to (0 = round-robin)
    poll_s: float = 2.0  # client's long-polling time
    reserve_s: float = 0.3  # proxy's reserve: brokers hold poll_s - reserve_s
    client_timeout_s: float = 3.0  # request timeout on top of poll_s (hard deadline = poll + this - reserve)
    batch: int = 32
    process_s: float = 0.0  # consumer: fixed time per non-empty answer (e.g. the ack round trip)
    process_per_msg_s: float = 0.0
    max_held: int = 20000  # per broker (broker --max-held)
    full_backoff_s: float = 1.0  # consumer: wait after TOO_MANY_REQUESTS (every broker full)
    duration: float = 10.0
    warmup: float = 1.0
    messages: int = 0  # > 0: stop producing after this many (sparse bench: 300)
    seed: int = 1
    adaptive: AdaptiveSettings = field(default_factory=AdaptiveSettings)
    random_rotation: bool = False  # each proxy's receive rotation starts at a random broker (default: at 0, as now)
    fleet_aware: bool = False  # AdaptiveSettings(proxies=<proxies>): concurrency judged fleet-wide
    latency: Latency = field(default_factory=Latency)
    sample_s: float = 0.1


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


class _Run:
    """One notify (or adaptive) receive on a proxy: the real NotifyRun plus its calls in flight."""

    def __init__(self, proxy: Proxy, consumer: Consumer, machine: NotifyRun, started: float) -> None:
        self.proxy = proxy
        self.consumer = consumer
        self.machine = machine
        self.started = started
        self.calls: dict[str, Req] = {}


class Proxy:
    def __init__(self, sim: Sim, index: int) -> None:
        self.sim = sim
        self.index = index
        # proxy.routing starts every proxy's receive rotation at broker 0; `random_rotation` starts each at a random
        # broker instead (proxies started at different times drift apart anyway; in the model they start together).
        self.rotation = sim.rng.randrange(sim.cfg.brokers) if sim.cfg.random_rotation else 0
        settings = sim.cfg.adaptive
        if sim.cfg.fleet_aware:  # the proposed setting, in proxy.receive.adaptive itself
            settings = dataclasses.replace(settings, proxies=sim.cfg.proxies)
        self.policy = AdaptivePolicy(settings)
        self.decisions = {"notify": 0, "longpoll": 0}
        self.names = [str(b) for b in range(sim.cfg.brokers)]

    def _live_brokers(self) -> int:
        return self.sim.cfg.brokers

    def receive(self, consumer: Consumer) -> None:
        sim, cfg = self.sim, self.sim.cfg
        now = sim.now
        mode = cfg.mode
        if mode == "adaptive":
            decision = self.policy.start(GROUP, now=now, live_brokers=self._live_brokers())
            mode = "longpoll" if decision.mode == LONGPOLL else "notify"
            self.decisions[mode] += 1
        poll = max(0.0, cfg.poll_s - cfg.reserve_s)
        n = cfg.brokers
        first = self.rotation % n
        self.rotation += 1
        if mode == "longpoll":

            def answered(req: Req, msgs: list[Msg], has: bool, full: bool) -> None:
                if full and not msgs:
                    self._finish(consumer, [], "full", now)
                else:
                    self._finish(consumer, msgs, "messages" if msgs else "empty", now)

            req = Req("pop", first, poll, cfg.batch, answered)
            sim.send(req)
            return
        order = [self.names[(first + i) % n] for i in range(n)]
        run = _Run(self, consumer, NotifyRun(order, now + poll), now)
        deadline = now + cfg.poll_s + cfg.client_timeout_s - cfg.reserve_s
        sim.at(now + poll, lambda: self._apply(run, run.machine.poll_over()))
        sim.at(deadline, lambda: self._apply(run, run.machine.deadline()))
        self._apply(run, run.machine.start())

    def _busy(self) -> bool:
        if self.sim.cfg.mode != "adaptive":
            return False
        return self.policy.busy(GROUP, now=self.sim.now, live_brokers=self._live_brokers())

    def _apply(self, run: _Run, commands: list[Command]) -> None:
        sim = self.sim
        for command in commands:
            if isinstance(command, Pop | Notify):
                kind = "pop" if isinstance(command, Pop) else "notify"
                b = int(command.broker)
                req = Req(
                    kind,
                    b,
                    command.poll_ms / 1000,
                    sim.cfg.batch,
                    functools.partial(self._answer, run),
                )
                run.calls[command.broker] = req
                sim.send(req)
            elif isinstance(command, Cancel):
                cancelled = run.calls.pop(command.broker, None)
                if cancelled is not None:
                    sim.cancel(cancelled)
            elif isinstance(command, Finish):
                for req in run.calls.values():
                    sim.cancel(req)
                run.calls.clear()
                msgs = cast(list[Msg], list(command.messages))
                outcome = "full" if command.error is not None else command.outcome
                self._finish(run.consumer, msgs, outcome, run.started)
                st = run.machine.stats
                sim.lost_races += st.lost_races
                sim.handoffs += int(st.handoff)

    def _answer(self, run: _Run, req: Req, msgs: list[Msg], has: bool, full: bool) -> None:
        sim = self.sim
        if req.cancelled or run.calls.get(str(req.broker)) is not req:
            sim.orphaned += len(msgs)  # popped by a call the run had given up: redelivered after invisible time
            return
        del run.calls[str(req.broker)]
        name = str(req.broker)
        if req.kind == "pop":
            busy = not msgs and self._busy()
            cmds = run.machine.popped(name, cast(Sequence[Any], msgs), polling_full=full, now=sim.now, busy=busy)
        else:
            cmds = run.machine.notified(name, has_message=has, polling_full=full, now=sim.now)
        self._apply(run, cmds)

    def _finish(self, consumer: Consumer, msgs: list[Msg], outcome: str, started: float) -> None:
        sim = self.sim
        if sim.cfg.mode == "adaptive":
            self.policy.end(GROUP, now=sim.now)
        sim.finished(consumer, msgs, outcome, started)


class Consumer:
    def __init__(self, sim: Sim, index: int, proxy: Proxy) -> None:
        self.sim = sim
        self.index = index
        self.proxy = proxy

    def start(self) -> None:
        self.sim.at(self.sim.now + self.sim.sample(self.sim.lat.request), self.proxy.receive, self)

    def answered(self, msgs: list[Msg], outcome: str) -> None:
        cfg = self.sim.cfg
        wait = cfg.full_backoff_s if outcome == "full" else 0.0
        if msgs:
            wait = cfg.process_s + cfg.process_per_msg_s * len(msgs)
        self.sim.at(self.sim.now + wait + self.sim.sample(self.sim.lat.request), self.proxy.receive, self)


@dataclass(slots=True)
class Result:
    cfg: Config
    delivered: int = 0
    latencies: list[float] = field(default_factory=list)  # from Send ack, s
    receives: int = 0
    empties: int = 0
    false_empties: int = 0
    full: int = 0
    pops: int = 0  # sent
    notifications: int = 0  # sent
    completed: int = 0  # answered and not cancelled: what the proxy's broker_rpcs_total counts
    measured_s: float = 0.0
    held_notes_mean: float = 0.0  # per broker, time average
    held_notes_max: int = 0  # on the busiest broker, at any sample
    lost_races: int = 0
    handoffs: int = 0
    orphaned: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    max_broker_rpc_s: float = 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(q / 100 * len(s)))] * 1000

    @property
    def rpcs_per_msg(self) -> float:
        return (self.pops + self.notifications) / max(1, self.delivered)

    @property
    def completed_per_msg(self) -> float:
        return self.completed / max(1, self.delivered)

    @property
    def false_empty_rate(self) -> float:
        return self.false_empties / max(1, self.receives)

    @property
    def rpc_per_broker_s(self) -> float:
        return (self.pops + self.notifications) / self.cfg.brokers / max(1e-9, self.measured_s)

    def row(self) -> dict[str, float]:
        return {
            "p50_ms": self.pct(50),
            "p90_ms": self.pct(90),
            "p99_ms": self.pct(99),
            "msg_s": self.delivered / max(1e-9, self.measured_s),
            "rpcs_per_msg": self.rpcs_per_msg,
            "completed_per_msg": self.completed_per_msg,
            "false_empties": self.false_empties,
            "false_empty_rate": self.false_empty_rate,
            "empties": self.empties,
            "rpc_per_broker_s": self.rpc_per_broker_s,
            "max_broker_rpc_s": self.max_broker_rpc_s,
            "held_notes_mean": self.held_notes_mean,
            "held_notes_max": self.held_notes_max,
        }


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


class Sim:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.lat = cfg.latency
        self.rng = random.Random(cfg.seed)
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.brokers = [Broker(self, b) for b in range(cfg.brokers)]
        self.proxies = [Proxy(self, p) for p in range(cfg.proxies)]
        if cfg.proxy_skew > 0:
            w = _zipf_weights(cfg.proxies, cfg.proxy_skew)
            picks = self.rng.choices(range(cfg.proxies), weights=w, k=cfg.consumers)
        else:
            picks = [c % cfg.proxies for c in range(cfg.consumers)]
        self.consumers = [Consumer(self, c, self.proxies[p]) for c, p in enumerate(picks)]
        self.broker_weights = _zipf_weights(cfg.brokers, cfg.skew) if cfg.skew > 0 else None
        self.result = Result(cfg)
        self.lost_races = 0
        self.handoffs = 0
        self.orphaned = 0
        self._produced = 0
        self._unserved: dict[int, Msg] = {}  # acked, not yet with a consumer (for false empties)
        self._oldest: deque[Msg] = deque()
        self._samples = 0
        self._held_sum = 0.0
        self._rpc_base: list[int] = []

    # -- engine ----------------------------------------------------------------

    def at(self, when: float, fn: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, fn, args))

    def sample(self, median: float) -> float:
        lat = self.lat
        v = median * lat.scale * math.exp(self.rng.gauss(0.0, lat.sigma)) if median > 0 else 0.0
        if lat.tail_p and self.rng.random() < lat.tail_p:
            v += self.rng.expovariate(1.0 / lat.tail_s)
        return v

    def send(self, req: Req) -> None:
        """Proxy -> broker: the call arrives one proxy step and one hop later."""
        broker = self.brokers[req.broker]
        if req.kind == "pop":
            self.result.pops += 1 if self.now >= self.cfg.warmup else 0
        else:
            self.result.notifications += 1 if self.now >= self.cfg.warmup else 0
        self.at(self.now + self.sample(self.lat.proxy_step) + self.sample(self.lat.hop), broker.receive, req)

    def deliver(self, req: Req, msgs: list[Msg], has: bool, full: bool) -> None:
        """A broker's answer reaches the proxy (counted as a completed call unless the proxy gave it up)."""
        if not req.cancelled and self.now >= self.cfg.warmup:
            self.result.completed += 1
        req.on_answer(req, msgs, has, full)

    def cancel(self, req: Req) -> None:
        req.cancelled = True
        if not req.answered:
            self.at(self.now + self.sample(self.lat.hop), self.brokers[req.broker].cancel, req)

    # -- workload --------------------------------------------------------------

    def _pick_broker(self) -> int:
        if self.broker_weights is None:
            return self.rng.randrange(self.cfg.brokers)
        return self.rng.choices(range(self.cfg.brokers), weights=self.broker_weights)[0]

    def _store(self, broker: int, count: int) -> None:
        """A Send of `count` messages: the broker stores (and wakes waiters), the producer gets the ack."""
        store = self.sample(self.lat.store)
        ack_hop = self.sample(self.lat.hop)
        t_store = self.now + self.sample(self.lat.hop) + store
        msgs = []
        for _ in range(count):
            self._produced += 1
            msgs.append(Msg(self._produced, broker, t_store + ack_hop, t_store))
        self.at(t_store, self._stored, broker, msgs)

    def _stored(self, broker: int, msgs: list[Msg]) -> None:
        for m in msgs:
            self._unserved[m.ident] = m
            self._oldest.append(m)
        self.brokers[broker].append(msgs)

    def _produce(self) -> None:
        cfg = self.cfg
        if cfg.messages and self._produced >= cfg.messages:
            return
        if cfg.arrivals == "ticks":  # the dense bench's producer: every 20 ms, rate × 20 ms messages
            owed = cfg.rate * 0.02
            count = int(owed) + (1 if self.rng.random() < owed - int(owed) else 0)
            by: dict[int, int] = {}
            for _ in range(count):
                b = self._pick_broker()
                by[b] = by.get(b, 0) + 1
            for b, k in by.items():
                self._store(b, k)
            self.at(self.now + 0.02, self._produce)
            return
        if cfg.arrivals == "uniform":  # the sparse bench's producer: gaps uniform in [1/3, 5/3] × mean
            mean = 1.0 / cfg.rate
            self._store(self._pick_broker(), 1)
            self.at(self.now + self.rng.uniform(mean / 3, mean * 5 / 3), self._produce)
            return
        rate = cfg.rate
        if cfg.burst > 1:  # on for 1/burst of each period at burst × rate, off otherwise: same mean
            into = self.now % cfg.burst_period
            if into >= cfg.burst_period / cfg.burst:
                self.at(self.now - into + cfg.burst_period, self._produce)
                return
            rate *= cfg.burst
        self._store(self._pick_broker(), 1)
        self.at(self.now + self.rng.expovariate(rate), self._produce)

    # -- accounting ------------------------------------------------------------

    def finished(self, consumer: Consumer, msgs: list[Msg], outcome: str, started: float) -> None:
        """The proxy answers; the consumer has the answer `answer` later."""
        t = self.now + self.sample(self.lat.answer)
        r = self.result
        counting = self.cfg.warmup <= t <= self.cfg.duration  # answers that reach consumers in the window
        if counting:
            r.receives += 1
        for m in msgs:
            self._unserved.pop(m.ident, None)
            if counting:
                r.delivered += 1
                r.latencies.append(t - m.acked)
        if not msgs and counting:
            if outcome == "full":
                r.full += 1
            else:
                r.empties += 1
                while self._oldest and self._oldest[0].ident not in self._unserved:
                    self._oldest.popleft()
                if self._oldest and self._oldest[0].acked < started:
                    r.false_empties += 1
        self.at(t, consumer.answered, msgs, outcome)

    def _sample_held(self) -> None:
        if self.now >= self.cfg.warmup:
            if not self._rpc_base:
                self._rpc_base = [b.rpcs["pop"] + b.rpcs["notify"] for b in self.brokers]
            self._samples += 1
            notes = [b.held_notes for b in self.brokers]
            self._held_sum += sum(notes) / len(notes)
            self.result.held_notes_max = max(self.result.held_notes_max, max(notes))
        self.at(self.now + self.cfg.sample_s, self._sample_held)

    def _sweep(self) -> None:
        for b in self.brokers:
            b.sweep()
        self.at(self.now + 1.0, self._sweep)

    def run(self) -> Result:
        cfg = self.cfg
        # Consumers join over the first 10 % of the warm-up, so they do not all start on the same tick.
        for c in self.consumers:
            self.at(self.rng.uniform(0, cfg.warmup * 0.1), c.start)
        self.at(self.rng.uniform(0, 0.02) + (cfg.warmup if cfg.messages else 0.0), self._produce)
        self.at(1.0, self._sweep)
        self.at(0.0, self._sample_held)
        queue = self._queue
        while queue:
            when, _, fn, args = heapq.heappop(queue)
            if when > cfg.duration:
                break
            self.now = when
            fn(*args)
        r = self.result
        r.measured_s = cfg.duration - cfg.warmup
        r.held_notes_mean = self._held_sum / max(1, self._samples)
        r.lost_races, r.handoffs, r.orphaned = self.lost_races, self.handoffs, self.orphaned
        r.decisions = {k: sum(p.decisions[k] for p in self.proxies) for k in ("notify", "longpoll")}
        if self._rpc_base:
            per = [
                b.rpcs["pop"] + b.rpcs["notify"] - base for b, base in zip(self.brokers, self._rpc_base, strict=True)
            ]
            r.max_broker_rpc_s = max(per) / max(1e-9, r.measured_s)
        return r


def simulate(cfg: Config) -> Result:
    return Sim(cfg).run()


__all__ = ["Config", "Latency", "Result", "Sim", "simulate", "DomainError"]
