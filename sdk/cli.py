"""The `popgate` command line: `up` (a local cluster in the foreground) and the client commands.

Client commands (send, receive, stats, dlq, bench) live in sdk.commands, sdk.admin and sdk.benchmark.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from sdk.cluster import Cluster, ClusterConfig, ClusterError


def _up_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser("up", help="run N brokers and a proxy locally until Ctrl-C")
    up.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    up.add_argument("--listen", default="127.0.0.1:8081", help="proxy address (port 0 = any free port)")
    up.add_argument("--data-dir", type=Path, default=Path("./data"), help="brokers' data and children's logs")
    up.add_argument(
        "--receive-mode", default="adaptive", choices=["adaptive", "notify", "longpoll"], help="proxy receive mode"
    )
    up.add_argument("--export-dir", default="", help="every process's JSON-lines metric snapshots, in DIR/<name>")
    up.add_argument("--flush", default="", choices=["", "sync", "async"], help="broker flush policy")
    up.add_argument("--metrics", action="store_true", help="every process serves /metrics on a free port (printed)")
    up.add_argument("--no-view", action="store_true", help="no live view: print the endpoint and wait (for scripts)")
    up.add_argument("--interval", type=float, default=1.0, help="live view refresh, seconds")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="popgate", description="popgate command line")
    sub = parser.add_subparsers(dest="command", required=True)
    _up_parser(sub)
    _client_parsers(sub)
    return parser


def _client_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from sdk import admin, benchmark, commands

    commands.add_parsers(sub)
    admin.add_parsers(sub)
    benchmark.add_parsers(sub)


def up(args: argparse.Namespace) -> int:
    if args.brokers < 1:
        print("popgate up: --brokers must be at least 1", file=sys.stderr)
        return 2
    config = ClusterConfig(
        brokers=args.brokers,
        listen=args.listen,
        data_dir=args.data_dir,
        receive_mode=args.receive_mode,
        export_dir=args.export_dir,
        flush=args.flush,
        metrics=args.metrics,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster(config)
    try:
        endpoint = cluster.start()
    except ClusterError as exc:
        print(f"popgate up: {exc}", file=sys.stderr)
        return 1
    try:
        brokers = ", ".join(f"{n}={c.address}" for n, c in cluster.brokers.items())
        print(f"popgate: proxy endpoint {endpoint}  (brokers {brokers}; logs in {args.data_dir})", flush=True)
        for child in [*cluster.brokers.values(), *cluster.proxies]:
            if child.metrics_url:
                print(f"popgate: {child.name} metrics {child.metrics_url}", flush=True)
        print(f"ready {endpoint}", file=sys.stderr, flush=True)
        if args.no_view:
            stop.wait()
        else:
            from sdk.live import LiveView

            LiveView(endpoint, {n: c.address for n, c in cluster.brokers.items()}).run(stop, args.interval)
    finally:
        print("popgate: stopping", file=sys.stderr, flush=True)
        cluster.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "up":
        return up(args)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        return 2
    return handler(args)


if __name__ == "__main__":
    raise SystemExit(main())
