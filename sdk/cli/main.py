"""The `popgate` command line: `up` (a local cluster in the foreground) and the client commands.

Client commands (send, receive, stats, dlq, bench) live in `commands`, `admin`, `dlq` and `benchmark` beside it;
the options they share in `options`, what they print in `output`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from popgate_process.config import distribution_version
from popgate_process.units import DURATION_FORMS, SIZE_FORMS

from .admin import BROKERS_MISSING
from .cluster import Child, Cluster, ClusterConfig, ClusterError, ClusterInterrupted
from .live import INTERVAL
from .operate import NOT_CONFIRMED
from .options import NOTHING_LISTENS, NothingListens
from .output import json_error
from .supervisor import Backoff, Supervisor
from .targets import Target, write_file_sd

EPILOG = (
    f"Durations: {DURATION_FORMS}. Sizes: {SIZE_FORMS}. Short flags mean the same in every command: -e endpoint, "
    "-g consumer group, -n count, -w wait, -b batch, -t topic, -q quiet. Exit codes: 0 done, 1 a server error "
    "(or no broker answered: dlq list, group, topic, lookup), 2 bad input, "
    f"{NOTHING_LISTENS} nothing listens at --endpoint, "
    f"{BROKERS_MISSING} stats left out a broker that did not answer or was not given, or an operation (group, topic,"
    f" lookup) was not answered by every broker (named on stderr), {NOT_CONFIRMED} a reset or delete not confirmed,"
    " 130 interrupted, 141 stdout's reader went away."
)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Each option's help ends with its default, in its units (``20s``, ``4KiB``), unless the help tells it
    already (says "default") or the default comes from the environment (the help says "env": it may be a secret,
    such as a key); tests/unit/sdk/test_cli_conventions.py."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        told = any(word in text.lower() for word in ("default", "env "))
        no_default = action.default in (None, "", [], argparse.SUPPRESS) or action.nargs == 0  # a flag: off
        if told or no_default or not action.option_strings:
            return action.help
        show = getattr(action.type, "show", None)
        shown = "%(default)s" if show is None else str(show(action.default)).replace("%", "%%")
        return f"{text} (default: {shown})"


class Parser(argparse.ArgumentParser):
    """The `popgate` parser; its subcommands' parsers are of this class too, so all show their defaults and how
    durations and sizes are written."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        kwargs.setdefault("epilog", f"Durations: {DURATION_FORMS}. Sizes: {SIZE_FORMS}.")
        super().__init__(*args, **kwargs)


# `popgate up` runs every broker on this machine, a Python process of ~40 MiB each —
# tests/integration/sdk/test_up.py::test_up_refuses_more_brokers_than_a_machine_runs_and_stops_while_spawning.
MAX_LOCAL_BROKERS = 64


def _up_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser("up", help="run N brokers and a proxy locally until Ctrl-C")
    up.add_argument("--brokers", type=int, default=3, help="number of brokers")
    up.add_argument("--listen", default="127.0.0.1:8081", help="proxy address (port 0 = any free port)")
    up.add_argument("--data-dir", type=Path, default="./data", help="brokers' data and children's logs")
    up.add_argument(
        "--receive-mode",
        default="",
        choices=["adaptive", "notify", "longpoll"],
        help="proxy receive mode (default: the proxy's, adaptive, or POPGATE_RECEIVE_MODE)",
    )
    up.add_argument("--export-dir", default="", help="every process's JSON-lines metric snapshots, in DIR/<name>")
    up.add_argument(
        "--flush", default="", choices=["sync", "async"], help="broker flush policy (default: the broker's, async)"
    )
    up.add_argument("--metrics", action="store_true", help="every process serves /metrics on a free port (printed)")
    up.add_argument(
        "--no-auto-create",
        action="store_true",
        help="brokers refuse unknown topics as a production broker does (default: dev mode, every broker is started"
        " with --auto-create and creates a topic on its first send)",
    )
    up.add_argument("--no-view", action="store_true", help="no live view: print the endpoint and wait (for scripts)")
    up.add_argument(
        "--no-restart",
        action="store_true",
        help="a child that dies stops the whole cluster (default: it is restarted on its port and data directory)",
    )
    up.add_argument(
        "--prometheus-sd",
        type=Path,
        default=None,
        metavar="FILE",
        help="write Prometheus file_sd targets of every child's /metrics to FILE, kept current (implies --metrics)",
    )
    up.add_argument(
        "--interval", type=INTERVAL, default=1.0, help="live view refresh (100ms..1h: each asks every broker)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="popgate", description="popgate command line", epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"popgate {distribution_version()}")
    # Subcommands' parsers are Parsers too (argparse makes them of the parent's class); typed as the plain kind
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]", parser.add_subparsers(dest="command", required=True)
    )
    _up_parser(sub)
    _client_parsers(sub)
    _name_parsers(parser)
    return parser


def _name_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser as its namespace's ``parser``: a stray argument is told with its own usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.set_defaults(parser=child)
                _name_parsers(child)


def _client_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from . import admin, benchmark, commands, dlq, live, operate

    commands.add_parsers(sub)
    admin.add_parsers(sub)
    dlq.add_parsers(sub)
    operate.add_parsers(sub)
    live.add_parsers(sub)
    benchmark.add_parsers(sub)


def _say(text: str, *, err: bool = False) -> None:
    """Print and flush; a closed terminal or pipe (EIO, EPIPE after a hang-up) must not stop the shutdown."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr if err else sys.stdout, flush=True)


def up(args: argparse.Namespace) -> int:
    if not 1 <= args.brokers <= MAX_LOCAL_BROKERS:
        print(f"popgate up: --brokers must be 1 to {MAX_LOCAL_BROKERS} (a cluster on this machine)", file=sys.stderr)
        return 2
    config = ClusterConfig(
        brokers=args.brokers,
        listen=args.listen,
        data_dir=args.data_dir,
        receive_mode=args.receive_mode,
        export_dir=args.export_dir,
        flush=args.flush,
        metrics=args.metrics or args.prometheus_sd is not None,
        auto_create=not args.no_auto_create,
        die_with_parent=True,  # a SIGKILLed `popgate up` leaves no brokers or proxy behind
    )
    stop = threading.Event()
    # SIGHUP: the terminal closed. The children run in their own sessions, so only we hear it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster(config)
    try:
        endpoint = cluster.start(stop)
    except ClusterInterrupted:
        _say("popgate up: interrupted while starting; stopped", err=True)
        return 130
    except ClusterError as exc:
        _say(f"popgate up: {exc}", err=True)
        return 1
    return _supervise(cluster, endpoint, args, stop)


def _supervise(cluster: Cluster, endpoint: str, args: argparse.Namespace, stop: threading.Event) -> int:
    """Serve until `stop` (a signal) or a child is given up, restarting children that die; then stop them all."""
    died: list[str] = []

    def give_up(child: Child, report: str) -> None:  # say so, and stop the rest
        died.append(f"popgate up: {report}")
        stop.set()

    # Said on stderr without the view; the view's processes line shows them instead of lines drawn over it.
    def dead(child: Child, how: str, delay: float) -> None:
        if args.no_view:
            _say(f"popgate: {child.name} {how}; restarting it in {delay:g} s", err=True)

    def restarted(child: Child) -> None:
        if args.no_view:
            _say(f"popgate: {child.name} restarted at {child.address}", err=True)
        _write_targets(args.prometheus_sd, cluster)

    # --no-restart: the first death gives the child up, which stops the cluster.
    backoff = Backoff(max_failures=0) if args.no_restart else Backoff()
    supervisor = Supervisor(cluster, backoff=backoff, on_death=dead, on_restart=restarted, on_give_up=give_up)
    supervisor.start()
    try:
        _announce(cluster, endpoint, args)
        if not _write_targets(args.prometheus_sd, cluster):
            return 1
        _say(f"ready {endpoint}", err=True)
        if args.no_view:
            stop.wait()
        else:
            from .admin import Broker
            from .live import LiveView

            token = os.environ.get("POPGATE_BROKER_TOKEN", "")  # the children's, when their token is on
            brokers = [Broker(n, c.address, token) for n, c in cluster.brokers.items()]
            LiveView(endpoint, brokers, processes=supervisor.statuses).run(stop, args.interval)
    finally:
        supervisor.close()
        for report in died:
            _say(report, err=True)
        _say("popgate: stopping", err=True)
        cluster.stop()
        supervisor.release()
    return 1 if died else 0


def _announce(cluster: Cluster, endpoint: str, args: argparse.Namespace) -> None:
    brokers = ", ".join(f"{n}={c.address}" for n, c in cluster.brokers.items())
    _say(f"popgate: proxy endpoint {endpoint}  (brokers {brokers}; logs in {args.data_dir})")
    listed = ",".join(cluster.broker_targets())
    _say(f"popgate: for stats, dlq list and top: export POPGATE_BROKERS={listed} POPGATE_ENDPOINT={endpoint}")
    for child in cluster.children():
        if child.metrics_url:
            _say(f"popgate: {child.name} metrics {child.metrics_url}")


def _write_targets(path: Path | None, cluster: Cluster) -> bool:
    """Write the file_sd targets to `path` (None: not asked); False, said on stderr, when it cannot be written."""
    if path is None:
        return True
    kinds = [("broker", c) for c in cluster.brokers.values()] + [("proxy", c) for c in cluster.proxies]
    try:
        write_file_sd(path, [Target(kind, c.name, c.metrics_address) for kind, c in kinds])
    except OSError as exc:
        _say(f"popgate up: cannot write --prometheus-sd {path}: {exc.strerror or exc}", err=True)
        return False
    return True


def _quiet_stdout() -> None:
    """After EPIPE on stdout: point it at /dev/null so the interpreter's final flush does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """`argv` parsed; a usage error (exit 2) for what no command takes."""
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "body", "") is None and extra:
        # `send TOPIC --tag T BODY` (or `-`, stdin; or `-- -BODY`, a body starting with '-'): argparse matched TOPIC
        # and an empty BODY together, leaving BODY over — test_cli_conventions.py::
        # test_a_body_starting_with_a_dash_is_given_after_the_end_of_options
        if extra[0] == "--" and len(extra) > 1:
            del extra[0]
            args.body = extra.pop(0)
        elif extra[0] == "-" or not extra[0].startswith("-"):
            args.body = extra.pop(0)
    if extra:
        getattr(args, "parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code. Bad input is one line on stderr and code 2, Ctrl-C code 130."""
    parser = build_parser()
    args = parse(parser, argv)
    if args.command == "up":
        return up(args)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        return 2
    command = getattr(args, "parser", parser).prog  # "popgate dlq resend"
    try:
        return handler(args)
    except BrokenPipeError:  # `popgate receive ... | head`: the reader is gone, nothing to report to
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:  # commands with a summary print it themselves and return 130
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except NothingListens as exc:  # told at once, not after the SDK's seconds of retries
        code, line = NOTHING_LISTENS, f"{command}: {exc}"
    except (OSError, ValueError) as exc:  # a file that cannot be read, a value the SDK refuses
        code, line = 2, f"{command}: {exc}"
    print(line, file=sys.stderr)
    json_error(getattr(args, "json", False), line)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
