"""The one-screen live view of `popgate up`: messages in/out per second, lag per group, held polls.

Numbers come from every broker's Stats RPC: "in" is the growth of the queues' max
offsets, "out" the growth of the groups' consumer (acked) offsets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .admin import Broker, Lag, lag_rows


@dataclass
class Sample:
    at: float
    produced: dict[str, int] = field(default_factory=dict)  # per broker that answered: Σ max offsets
    acked: dict[str, int] = field(default_factory=dict)  # per broker that answered: Σ consumer offsets
    groups: dict[tuple[str, str], Lag] = field(default_factory=dict)  # (topic, group): summed over brokers
    held: dict[str, int] = field(default_factory=dict)
    down: list[str] = field(default_factory=list)


def summarize(stats: Mapping[str, bpb.StatsResponse | None], at: float) -> Sample:
    answered = {broker: reply for broker, reply in stats.items() if reply is not None}
    sample = Sample(at, groups=lag_rows(answered), down=[broker for broker in stats if broker not in answered])
    for broker, reply in answered.items():
        sample.produced[broker] = sum(q.max_offset for q in reply.queues if not q.topic.startswith("%"))
        sample.acked[broker] = sum(g.consumer_offset for g in reply.groups)
        sample.held[broker] = reply.held_pops + reply.held_notifications
    return sample


def rates(now: Sample, before: Sample | None) -> tuple[float, float]:
    """Messages in/s and acked out/s between two samples, over the brokers that answered both: a broker
    missing from one poll would otherwise drop its whole offset from one sum (a negative rate), then add
    it back (a burst)."""
    if before is None:
        return 0.0, 0.0
    elapsed = max(1e-6, now.at - before.at)
    both = now.produced.keys() & before.produced.keys()
    rate_in = sum(now.produced[b] - before.produced[b] for b in both) / elapsed
    rate_out = sum(now.acked[b] - before.acked[b] for b in both) / elapsed
    return rate_in, rate_out


def render(endpoint: str, now: Sample, before: Sample | None) -> Group:
    rate_in, rate_out = rates(now, before)
    lines: list[RenderableType] = [
        Text(f"popgate  proxy {endpoint}   {time.strftime('%H:%M:%S')}   (Ctrl-C stops everything)", style="bold"),
        Text(""),
        Text(f"messages in/s {rate_in:10.1f}     acked out/s {rate_out:10.1f}"),
        Text("held polls    " + "  ".join(f"{b}={n}" for b, n in sorted(now.held.items()))),
    ]
    if now.down:
        lines.append(Text("DOWN          " + " ".join(sorted(now.down)), style="bold red"))
    lines.append(Text(""))
    ranked = sorted(now.groups.items(), key=lambda kv: -kv[1].lag)[:15]
    if not ranked:
        lines.append(Text("(no consumer groups yet)"))
        return Group(*lines)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("topic", overflow="fold")
    table.add_column("group", overflow="fold")
    table.add_column("lag", justify="right")
    table.add_column("inflight", justify="right")
    for (topic, group), row in ranked:
        table.add_row(topic, group, str(row.lag), str(row.inflight))
    lines.append(table)
    return Group(*lines)


class LiveView:
    def __init__(self, endpoint: str, brokers: Mapping[str, str], *, token: str = "") -> None:
        """token: the brokers' shared token when they require one (their --broker-token)."""
        self._endpoint = endpoint
        self._brokers = [Broker(name, target, token) for name, target in brokers.items()]
        self._channels = {b.name: grpc.insecure_channel(b.target) for b in self._brokers}
        self._stubs = {name: broker_pb2_grpc.BrokerStub(ch) for name, ch in self._channels.items()}  # type: ignore[no-untyped-call]

    def poll(self) -> Sample:
        replies: dict[str, bpb.StatsResponse | None] = {}
        for broker in self._brokers:
            stub = self._stubs[broker.name]
            try:
                replies[broker.name] = stub.Stats(bpb.StatsRequest(), timeout=1.0, metadata=broker.metadata)
            except grpc.RpcError:
                replies[broker.name] = None
        return summarize(replies, time.monotonic())

    def run(self, stop: threading.Event, interval_s: float) -> None:
        console = Console(highlight=False, markup=False, emoji=False)
        before: Sample | None = None
        try:
            with Live(console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live:
                while not stop.is_set():
                    now = self.poll()
                    live.update(render(self._endpoint, now, before), refresh=True)
                    before = now
                    stop.wait(interval_s)
        except OSError:  # the terminal is gone (EIO after a hang-up): stop, as SIGHUP does
            return
        finally:
            for channel in self._channels.values():
                channel.close()
