"""popgate beside Redis Streams and NATS JetStream in one run of the peers' harness (shared/peers/bench.py).

    .venv/bin/python bench/peers_run.py [--scenarios latency,throughput,idle] [--systems redis,nats,popgate]
                                        [--popgate-brokers 1] [--receive-mode adaptive] [--ack-wait]
                                        [--n-throughput 50000] [--out DIR]

Needs redis-server and nats-server on PATH (apt: redis-server nats-server) and the redis / nats-py
packages in the venv (the harness imports the peers' adapters). Each system runs on a fresh server
(popgate: `popgate.cli.cluster`, brokers with --flush async, comparable to Redis appendfsync everysec and
JetStream's OS-buffered writes). popgate's acks are not waited for (`ack_many(wait=False)`), as the NATS
adapter's default `msg.ack()`; --ack-wait waits for each (as NATS's `ack_sync()`). Prints one markdown table per
scenario; JSON results go to --out. popgate's SDK runs in the harness on grpc's poller I/O: importing popgate.cli
sets GRPC_EXPERIMENTS here and the harness inherits it (an application importing the SDK gets grpc's default
EventEngine unless it sets the variable: docs/SDK.md, "gRPC I/O engine").
shared/ is read-only: the harness is run from there, and writes nowhere there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEERS = Path(os.environ.get("PEERS_DIR", ROOT.parent / "shared" / "peers"))
sys.path.insert(0, str(PEERS))
sys.path.insert(0, str(ROOT))

KEYS = {
    "latency": ["p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms", "empties", "n_received"],
    "throughput": [
        "produce_msg_s",
        "consume_ack_msg_s",
        "seq_send_msg_s",
        "server_cpu_s_per_100k_total",
        "client_cpu_s_per_100k_produce",
        "client_cpu_s_per_100k_consume",
        "consumed",
    ],
    "idle": [
        "n",
        "pending_through_window",
        "server_rss_delta_mb",
        "server_rss_kb_per_waiter",
        "server_cpu_pct_idle",
        "client_cpu_pct_idle",
        "wake_ms_median",
    ],
}


@contextmanager
def redis() -> Iterator[tuple[str, dict[str, Any]]]:
    import servers  # type: ignore[import-not-found]

    srv = servers.start_redis(7301)
    try:
        yield "redis_adapter:RedisStreamsAdapter", {"port": 7301, "server_pids": [srv.pid]}
    finally:
        srv.stop()


@contextmanager
def nats() -> Iterator[tuple[str, dict[str, Any]]]:
    import servers

    srv = servers.start_nats(7422)
    try:
        yield "nats_adapter:NatsJetStreamAdapter", {"url": "nats://127.0.0.1:7422", "server_pids": [srv.pid]}
    finally:
        srv.stop()


def popgate(brokers: int, receive_mode: str, ack_wait: bool) -> Callable[[], Any]:
    @contextmanager
    def run() -> Iterator[tuple[str, dict[str, Any]]]:
        from popgate.cli.cluster import Cluster, ClusterConfig

        with tempfile.TemporaryDirectory(prefix="popgate-peers-") as data:
            config = ClusterConfig(
                brokers=brokers, listen="127.0.0.1:0", data_dir=Path(data), flush="async", receive_mode=receive_mode
            )
            with Cluster(config) as cluster:
                pids = [c.process.pid for c in [*cluster.proxies, *cluster.brokers.values()] if c.process]
                adapter = {"endpoint": cluster.endpoint, "server_pids": pids, "ack_wait": ack_wait}
                yield "peers_adapter:PopgateAdapter", adapter

    return run


def run_one(spec: str, config: dict[str, Any], scenario: str, out: Path, n: int | None) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "bench"), str(PEERS)]))
    argv = [sys.executable, str(PEERS / "bench.py"), "--adapter", spec, "--config", json.dumps(config)]
    argv += ["--scenario", scenario, "--out", str(out)]
    if n:
        argv += ["--n", str(n)]
    subprocess.run(argv, check=True, timeout=900, env=env, stdout=subprocess.DEVNULL, cwd=PEERS)
    result: dict[str, Any] = json.loads(out.read_text())
    wakes = result.get("wake_ms_5") or []
    result["wake_ms_median"] = statistics.median(wakes) if wakes else None
    return result


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.2f}"
    return str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="latency,throughput,idle")
    parser.add_argument("--systems", default="redis,nats,popgate")
    parser.add_argument("--popgate-brokers", default="1", help="comma-separated broker counts, one column each")
    parser.add_argument("--receive-mode", default="adaptive", help="popgate proxy receive mode")
    parser.add_argument("--ack-wait", action="store_true", help="popgate waits for each ack's answer")
    parser.add_argument("--n-throughput", type=int, default=50_000)
    parser.add_argument("--n-idle", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "popgate-peers")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    systems: dict[str, Callable[[], Any]] = {}
    for name in args.systems.split(","):
        if name == "popgate":
            for b in args.popgate_brokers.split(","):
                acks = ", acks waited for" if args.ack_wait else ""
                label = f"popgate ({b} broker{'s' if b != '1' else ''}, {args.receive_mode}{acks})"
                systems[label] = popgate(int(b), args.receive_mode, args.ack_wait)
        else:
            systems[name] = {"redis": redis, "nats": nats}[name]
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for scenario in args.scenarios.split(","):
        n = {"throughput": args.n_throughput, "idle": args.n_idle}.get(scenario)
        for system, start in systems.items():
            print(time.strftime("%H:%M:%S"), scenario, system, flush=True)
            with start() as (spec, config):
                slug = "".join(c if c.isalnum() else "_" for c in system).strip("_")
                out = args.out / f"{scenario}_{slug}.json"
                results.setdefault(scenario, {})[system] = run_one(spec, config, scenario, out, n)
    for scenario, by_system in results.items():
        print(f"\n### {scenario}\n\n| metric | " + " | ".join(by_system) + " |")
        print("|---|" + "---:|" * len(by_system))
        for key in KEYS[scenario]:
            print(f"| {key} | " + " | ".join(cell(r.get(key)) for r in by_system.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
