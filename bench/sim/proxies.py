"""The simulated proxies, driving the real `NotifyRun` and `AdaptivePolicy`, and the consumers connected to them."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from bench.sim.brokers import Msg, Req
from proxy.receive.adaptive import LONGPOLL, AdaptivePolicy
from proxy.receive.notify import NotifyRun
from proxy.receive.notify_commands import Cancel, Command, Finish, Notify, Pop

if TYPE_CHECKING:
    from bench.sim.model import Sim

GROUP = "g"


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
