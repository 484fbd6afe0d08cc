"""The one-screen live view of `popgate up` and `popgate top`: messages in/out per second, lag per group, held
polls, the state of `popgate up`'s children, and which brokers are missing.

Numbers come from every broker's Stats RPC: "in" is the growth of the queues' max
offsets, "out" the growth of the groups' consumer (acked) offsets. A topic no group reads yet shows as a row
of its own, with its stored messages (tests/unit/sdk/test_live.py).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .admin import (
    Broker,
    Lag,
    broker_channel,
    broker_options,
    fetch_stats,
    given_brokers,
    lag_rows,
    proxy_options,
    routed_brokers,
    stored_messages,
)
from .options import POSITIVE_DURATION, Duration, Sub
from .proxy_admin import ProxyAdmin, ProxyAdminError
from .supervisor import State, Status, describe

# A broker that comes back (restarted by `popgate up`) is asked again within a second, not after grpc's
# reconnect backoff (up to 2 minutes).
CHANNEL_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]
# A refresh asks every broker's Stats: 0 (or less) would ask them in a busy loop.
INTERVAL = Duration(low=0.1, high=3600.0)


@dataclass
class Sample:
    at: float
    produced: dict[str, int] = field(default_factory=dict)  # per broker that answered: Σ max offsets
    acked: dict[str, int] = field(default_factory=dict)  # per broker that answered: Σ consumer offsets
    groups: dict[tuple[str, str], Lag] = field(default_factory=dict)  # (topic, group): summed over brokers
    held: dict[str, int] = field(default_factory=dict)
    down: list[str] = field(default_factory=list)
    stored: dict[str, int] = field(default_factory=dict)  # topic -> messages stored, over the brokers that answered
    cut: list[str] = field(default_factory=list)  # brokers whose answer left groups out (their gRPC message limit)


def summarize(stats: Mapping[str, bpb.StatsResponse | None], at: float) -> Sample:
    answered = {broker: reply for broker, reply in stats.items() if reply is not None}
    sample = Sample(at, groups=lag_rows(answered), down=[broker for broker in stats if broker not in answered])
    sample.stored = stored_messages(answered)
    sample.cut = sorted(broker for broker, reply in answered.items() if reply.cut)
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


@dataclass(frozen=True)
class Frame:
    """What a live view shows besides the brokers' figures."""

    endpoint: str
    quit_hint: str = "Ctrl-C stops everything"
    unknown: Sequence[str] = ()  # brokers the proxy routes to whose address was not given (`top`)
    processes: Sequence[Status] = ()  # `popgate up`'s children
    failed: str = ""  # why the proxy gave no figures at the last poll (`top` through the proxy): none when empty


def rows(now: Sample) -> list[tuple[str, str, str, str, str]]:
    """(topic, group, lag, inflight, stored) rows: the 15 groups with most lag, then topics no group reads
    (group "-"), most stored first; `%` topics (dead letters) only when a group reads them."""
    ranked = sorted(now.groups.items(), key=lambda kv: -kv[1].lag)[:15]
    out = [(t, g, str(r.lag), str(r.inflight), str(now.stored.get(t, 0))) for (t, g), r in ranked]
    read = {topic for topic, _ in now.groups}
    unread = sorted(((n, t) for t, n in now.stored.items() if t not in read and not t.startswith("%")), reverse=True)
    out += [(t, "-", "-", "-", str(n)) for n, t in unread[: max(0, 20 - len(out))]]
    return out


def render(frame: Frame | str, now: Sample, before: Sample | None) -> Group:
    if isinstance(frame, str):
        frame = Frame(frame)
    rate_in, rate_out = rates(now, before)
    lines: list[RenderableType] = [
        Text(f"popgate  proxy {frame.endpoint}   {time.strftime('%H:%M:%S')}   ({frame.quit_hint})", style="bold"),
        Text(""),
        Text(f"messages in/s {rate_in:10.1f}     acked out/s {rate_out:10.1f}"),
        Text("held polls    " + "  ".join(f"{b}={n}" for b, n in sorted(now.held.items()))),
    ]
    if frame.processes:
        healthy = all(p.state is State.UP for p in frame.processes)
        lines.append(Text("processes     " + describe(frame.processes, now.at), style="" if healthy else "bold yellow"))
    if frame.failed:
        lines.append(Text("PROXY         " + frame.failed, style="bold red"))
    if now.down:
        lines.append(Text("DOWN          " + " ".join(sorted(now.down)), style="bold red"))
    if now.cut:
        part = " ".join(now.cut)
        lines.append(
            Text(f"PART          {part} (groups left out to fit a gRPC message: `popgate stats -t TOPIC`)", "red")
        )
    if frame.unknown:
        missing = " ".join(sorted(frame.unknown))
        lines.append(Text(f"NOT ASKED     {missing} (the proxy routes to them: give --broker NAME=HOST:PORT)", "red"))
    lines.append(Text(""))
    table_rows = rows(now)
    if not table_rows:
        lines.append(Text("(no topics yet)"))
        return Group(*lines)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("topic", overflow="fold")
    table.add_column("group", overflow="fold")
    for column in ("lag", "inflight", "stored"):
        table.add_column(column, justify="right")
    for row in table_rows:
        table.add_row(*row)
    lines.append(table)
    return Group(*lines)


class LiveView:
    def __init__(
        self,
        endpoint: str,
        brokers: Sequence[Broker],
        *,
        processes: Callable[[], Sequence[Status]] = tuple,
        unknown: Sequence[str] = (),
        quit_hint: str = "Ctrl-C stops everything",
        proxy: ProxyAdmin | None = None,
        timeout_s: float = 1.0,
    ) -> None:
        """brokers: asked directly, with their token and TLS CA when they have one, each within `timeout_s`;
        processes: the supervised children's states (`popgate up`); unknown: brokers the proxy routes to but not
        asked; proxy: ask every broker through the proxy's admin service instead of `brokers` (closed with the
        view)."""
        self._timeout_s = timeout_s
        self._endpoint = endpoint
        self._proxy = proxy
        self._seen: set[str] = set()  # brokers the proxy named: all down when the proxy does not answer
        self._failed = ""  # the proxy's failure at the last poll, shown (one that is no proxy shows no cluster)
        self._processes = processes
        self._unknown = unknown
        self._quit_hint = quit_hint
        self._brokers = list(brokers)
        self._channels = {b.name: broker_channel(b, CHANNEL_OPTIONS) for b in self._brokers}
        self._stubs = {name: broker_pb2_grpc.BrokerStub(ch) for name, ch in self._channels.items()}  # type: ignore[no-untyped-call]

    def poll(self) -> Sample:
        if self._proxy is not None:
            return summarize(self._through_proxy(self._proxy), time.monotonic())
        # Every broker asked at once: a refresh waits one timeout however many brokers do not answer —
        # tests/unit/sdk/test_live.py::test_a_refresh_waits_one_timeout_for_brokers_that_do_not_answer.
        calls = {
            b.name: self._stubs[b.name].Stats.future(bpb.StatsRequest(), timeout=self._timeout_s, metadata=b.metadata)
            for b in self._brokers
        }
        replies: dict[str, bpb.StatsResponse | None] = {}
        for name, call in calls.items():
            try:
                replies[name] = call.result()
            except grpc.RpcError:
                replies[name] = None
        return summarize(replies, time.monotonic())

    def _through_proxy(self, proxy: ProxyAdmin) -> dict[str, bpb.StatsResponse | None]:
        try:
            gathered = proxy.stats(bpb.StatsRequest())
        except ProxyAdminError as exc:
            self._failed = str(exc)
            return dict.fromkeys(self._seen)
        self._failed = ""
        replies: dict[str, bpb.StatsResponse | None] = {**gathered.answers, **dict.fromkeys(gathered.failures)}
        self._seen |= replies.keys()
        return replies

    def frame(self) -> Frame:
        """What the view shows besides the figures of the last `poll`."""
        return Frame(self._endpoint, self._quit_hint, self._unknown, self._processes(), self._failed)

    def run(self, stop: threading.Event, interval_s: float) -> None:
        console = Console(highlight=False, markup=False, emoji=False)
        before: Sample | None = None
        try:
            with Live(console=console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False) as live:
                while not stop.is_set():
                    now = self.poll()
                    live.update(render(self.frame(), now, before), refresh=True)
                    before = now
                    stop.wait(interval_s)
        except OSError:  # the terminal is gone (EIO after a hang-up): stop, as SIGHUP does
            return
        finally:
            self.close()

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        if self._proxy is not None:
            self._proxy.close()


def add_parsers(sub: Sub) -> None:
    top = sub.add_parser("top", help="the live view of `popgate up`, on any running cluster")
    broker_options(top)
    proxy_options(top)
    top.add_argument("--interval", type=INTERVAL, default=1.0, help="refresh (100ms..1h: each asks every broker)")
    top.add_argument(
        "--timeout", type=POSITIVE_DURATION, default=3.0, help="deadline of each broker's (or the proxy's) answer"
    )
    top.set_defaults(handler=top_command, topic="")


def top_command(args: argparse.Namespace) -> int:
    """Until Ctrl-C (exit 0). Through the proxy's admin service given only --endpoint; else the brokers given,
    and with --endpoint too those the proxy routes to but that were not given are shown as not asked."""
    brokers = given_brokers(args)
    unknown: list[str] = []
    proxy = None
    if brokers:
        responses = fetch_stats(brokers, bpb.StatsRequest(), args.timeout)
        unknown = sorted((routed_brokers(args, responses) or set()) - {b.name for b in brokers})
    else:
        proxy = ProxyAdmin(args, args.timeout)
    view = LiveView(
        args.endpoint or "-", brokers, unknown=unknown, quit_hint="Ctrl-C quits", proxy=proxy, timeout_s=args.timeout
    )

    def quit_now(*_: object) -> None:
        # A poll in flight is abandoned, not waited out (up to --timeout + 5 s at a proxy that never answers) —
        # test_cli.py::test_ctrl_c_quits_top_at_once_while_the_proxy_does_not_answer
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, quit_now)
    with contextlib.suppress(KeyboardInterrupt):
        view.run(threading.Event(), args.interval)  # closes the view however it ends
    return 0
