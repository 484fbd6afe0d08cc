"""Discrete-event model of popgate receive: N brokers, M proxies, C consumers, one topic and group.

The proxies run the real sans-IO pieces — `proxy.receive.notify.NotifyRun` (pop with notify) and
`proxy.receive.adaptive.AdaptivePolicy` (the adaptive switch) — fed with simulated time; only the I/O is
modelled: one-way hops with lognormal jitter, broker processing, held requests, the wake rule of
`broker.longpoll` (one held request per new message, oldest first whatever its kind, plus the 1 s
safety sweep), the per-broker held limit (`polling_full`), and the consumers' processing time.

Everything is seeded: one `Sim(config)` → one result, bit for bit.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from typing import Any

from bench.sim.brokers import Broker, Msg, Req
from bench.sim.config import Config, Latency
from bench.sim.proxies import Consumer, Proxy
from bench.sim.result import Result
from popgate_contract.errors import DomainError


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
