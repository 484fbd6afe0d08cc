"""What a broker does per message, called directly and through the proxy: its requests, commits, syscalls, CPU.

    .venv/bin/python -m bench.broker_calls [--brokers 1] [--messages 50000] [--rounds 1] [--sides direct,sdk]
                                           [--direct-rate MSG_S] [--receive-mode MODE] [--py-spy DIR]

The phases of `bench.ratios` (produce, then consume+ack, 256 B messages, 8 workers, batches of 32): *direct* on
the brokers' Session streams, *sdk* with `popgate.aio` through the proxy. Around each measured phase it reads
broker b1..bN's `/metrics` and broker b1's `/proc`, and prints per 1,000 messages:

- the broker requests of each kind (`popgate_broker_rpc_duration_seconds_count` by method: a Session request
  counts once, a cancel frame not at all) and the store commits (`..._store_commit_duration_seconds_count`);
- b1's syscalls that read and write (`/proc/PID/io`) and its voluntary / involuntary context switches;
- CPU µs per message, of all brokers and of each of b1's threads (named as `py-spy dump` names them).

`--direct-rate` paces the direct phases at that many messages a second, so that a broker called directly can be
compared with one behind the proxy at the same load (a broker's cost per message falls as its load rises: wake-ups
and group commits are shared by more messages). `--py-spy DIR` records b1 with `py-spy record --gil` during each
measured phase (`DIR/<round>-<side>-<kind>.txt`, raw collapsed stacks). Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections import Counter
from pathlib import Path

from bench.ratios import Claims, Direct, Meter, Phase, Sdk, Step, direct_client, run_phase, sdk_client
from popgate.cli.cluster import Cluster, ClusterConfig

ROOT = Path(__file__).resolve().parents[1]
PY_SPY = ROOT / ".venv/bin/py-spy"
SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'([a-z_]+)="([^"]*)"')
CPU = "cpu "  # the prefix of per-thread CPU counters


def scrape(url: str) -> Counter[str]:
    """Broker requests by method and store commits, summed over their other labels."""
    out: Counter[str] = Counter()
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m is None:
            continue
        name, value = m["name"], float(m["value"])
        if name == "popgate_broker_rpc_duration_seconds_count":
            method = dict(LABEL.findall(m["labels"] or "")).get("method", "")
            out[method.removeprefix("Session.")] += value
        elif name == "popgate_broker_store_commit_duration_seconds_count":
            out["commits"] += value
    return out


def thread_names(pid: int) -> dict[int, str]:
    """The Python names of a process's threads by OS thread id (`py-spy dump` prints both)."""
    dump = subprocess.run([str(PY_SPY), "dump", "--pid", str(pid)], capture_output=True, text=True, check=False)
    return {int(m[1]): m[2] for m in re.finditer(r'^Thread (\d+) \(\w+\): "([^"]+)"', dump.stdout, re.M)}


def proc_counts(pid: int, names: dict[int, str]) -> Counter[str]:
    """Read and write syscalls, context switches, and CPU ms of each thread of the process."""
    out: Counter[str] = Counter()
    with open(f"/proc/{pid}/io") as fh:
        for line in fh:
            key, value = line.split(":")
            if key in ("syscr", "syscw"):
                out[key] += int(value)
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{task}/status") as fh:
                status = fh.read()
        except FileNotFoundError:  # the thread ended
            continue
        out[CPU + names.get(int(task), f"tid {task}")] += (int(fields[11]) + int(fields[12])) * tick_ms
        for key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            found = re.search(rf"^{key}:\s+(\d+)", status, re.M)
            out["vcsw" if key.startswith("vol") else "ivcsw"] += int(found[1]) if found else 0
    return out


class Probe:
    """What is read around a measured phase: the brokers' metrics, b1's /proc, and optionally py-spy on b1."""

    def __init__(self, cluster: Cluster, spy_dir: str) -> None:
        self.urls = [child.metrics_url for child in cluster.brokers.values()]
        b1 = next(iter(cluster.brokers.values())).process
        assert b1 is not None
        self.pid = b1.pid
        self.names = thread_names(self.pid)
        self.spy_dir = spy_dir
        self.spy: subprocess.Popen[bytes] | None = None

    def read(self) -> Counter[str]:
        out = proc_counts(self.pid, self.names)
        for url in self.urls:
            out.update(scrape(url))
        return out

    def start_spy(self, name: str) -> None:
        if self.spy_dir:
            out = os.path.join(self.spy_dir, name + ".txt")
            argv = [str(PY_SPY), "record", "--gil", "-r", "500", "-p", str(self.pid), "-f", "raw", "-o", out]
            self.spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop_spy(self) -> None:
        if self.spy is not None:
            self.spy.send_signal(signal.SIGINT)
            self.spy.wait(30)
            self.spy = None


def paced(step: Step, rate: float, batch: int) -> Step:
    """`step` started at most `rate` messages a second over all workers, `batch` messages a step (0: unpaced)."""
    if not rate:
        return step
    next_start = 0.0

    async def slow() -> int:
        nonlocal next_start
        now = asyncio.get_running_loop().time()
        start = max(now, next_start)
        next_start = start + batch / rate
        if start > now:
            await asyncio.sleep(start - now)
        return await step()

    return slow


Row = tuple[Phase, Counter[str]]


async def measured(kind: str, side: str, total: int, step: Step, meter: Meter, probe: Probe, name: str) -> Row:
    before = probe.read()
    probe.start_spy(name)
    try:
        run = await run_phase(total, ARGS.concurrency, step, meter)
    finally:
        probe.stop_spy()
    counts = probe.read()
    counts.subtract(before)
    return Phase(side, kind, run.done, run.seconds, run.cpu), counts


async def one_round(client: Direct | Sdk, side: str, topic: str, meter: Meter, probe: Probe, i: int) -> list[Row]:
    args = ARGS
    c, w, n = args.concurrency, args.warmup, args.messages
    rate = args.direct_rate if side == "direct" else 0.0
    await run_phase(w, c, client.produce(topic, Claims(w)))
    step = paced(client.produce(topic, Claims(n)), rate, args.batch)
    produced = await measured("produce", side, n, step, meter, probe, f"{i}-{side}-produce")
    warm = await run_phase(w, c, client.consume(topic))
    step = paced(client.consume(topic), rate, args.batch)
    consumed = await measured("consume", side, w + n - warm.done, step, meter, probe, f"{i}-{side}-consume")
    return [produced, consumed]


async def run(cluster: Cluster, meter: Meter) -> list[Row]:
    addresses = [child.address for child in cluster.brokers.values()]
    probe = Probe(cluster, ARGS.py_spy)
    rows: list[Row] = []
    for i in range(ARGS.rounds):
        for side in ARGS.sides.split(","):
            topic = f"calls-{side}-{i}"
            print(f"round {i + 1}: {side}", file=sys.stderr, flush=True)
            if side == "direct":
                async with direct_client(addresses, ARGS) as direct:
                    rows += await one_round(direct, side, topic, meter, probe, i)
            else:
                async with sdk_client(cluster.endpoint, topic, ARGS) as sdk:
                    rows += await one_round(sdk, side, topic, meter, probe, i)
    return rows


def report(rows: list[Row], brokers: list[str]) -> None:
    keys = sorted({k for _, c in rows for k, v in c.items() if v and not k.startswith(CPU)})
    threads = sorted({k for _, c in rows for k, v in c.items() if v > 0 and k.startswith(CPU)})
    print(f"{'per 1,000 messages':<18}{'msg/s':>9}" + "".join(f"{k:>10}" for k in keys))
    for phase, counts in rows:
        cells = "".join(f"{counts[k] * 1000 / phase.messages:>10.1f}" for k in keys)
        print(f"{phase.side + ' ' + phase.kind:<18}{phase.rate:>9,.0f}{cells}")
    print(f"\n{'CPU µs per message':<18}{'brokers':>9}" + "".join(f"{k[len(CPU) :][:16]:>18}" for k in threads))
    for phase, counts in rows:
        cells = "".join(f"{counts[k] * 1000 / phase.messages:>18.1f}" for k in threads)
        print(f"{phase.side + ' ' + phase.kind:<18}{phase.us_per_msg(*brokers):>9.1f}{cells}")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--messages", type=int, default=50_000, help="messages per measured phase")
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--sides", default="direct,sdk", help="which sides each round runs, in order")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32, help="direct Send size; Pop and receive max")
    parser.add_argument("--send-chunk", type=int, default=32, help="messages per SDK send_many call")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--wait", type=float, default=1.0, help="SDK receive's long-polling seconds")
    parser.add_argument("--direct-rate", type=float, default=0.0, help="pace direct phases at this many msg/s")
    parser.add_argument("--receive-mode", default="")
    parser.add_argument("--py-spy", default="", help="a directory for py-spy's raw stacks of broker b1")
    return parser.parse_args()


ARGS = argparse.Namespace()


def main() -> None:
    global ARGS
    ARGS = parse()
    if ARGS.py_spy:
        os.makedirs(ARGS.py_spy, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="popgate-calls-") as tmp:
        config = ClusterConfig(
            brokers=ARGS.brokers,
            listen="127.0.0.1:0",
            data_dir=Path(tmp),
            flush="async",
            receive_mode=ARGS.receive_mode,
            metrics=True,
        )
        with Cluster(config) as cluster:
            children = {"proxy": cluster.proxies[0], **cluster.brokers}
            pids = {"client": os.getpid()} | {name: c.process.pid for name, c in children.items() if c.process}
            rows = asyncio.run(run(cluster, Meter(pids)))
    report(rows, list(cluster.brokers))


if __name__ == "__main__":
    main()
