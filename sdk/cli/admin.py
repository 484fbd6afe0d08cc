"""`popgate stats`, and what the commands that ask brokers share (their addresses, token and channels).

Lag and stored messages are broker facts the v2 protocol does not carry. `stats` gets them through the proxy's
admin service (``-e/--endpoint``, `proxy_admin.py`), which asks every broker it routes to, or from the brokers
themselves (broker.proto ``Stats``) at the ``--broker NAME=HOST:PORT`` addresses (what `popgate up` prints; env
POPGATE_BROKERS, else the proxy's POPGATE_BROKER) — for a proxy-less emergency. Given both, it asks the brokers
and the proxy which brokers exist, so a broker left out of the list is named too. `dlq list` (`dlq.py`) asks the
brokers. Figures summed over brokers are never silently partial: a broker that did not answer, or that the
proxy routes to but was not asked, is named on stderr and the exit code is BROKERS_MISSING (`Coverage`,
tests/unit/sdk/test_coverage.py).
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb import broker_pb2_grpc as bpb_grpc
from rich.table import Table

from popgate_contract.broker_token import TOKEN_KEY
from popgate_contract.lag import lag_seconds

from .options import POSITIVE_DURATION, NothingListens, Sub, client_options, json_option
from .output import error_console, json_error, print_json, print_table
from .proxy_admin import PROBE_TOPIC, ProxyAdmin, ProxyAdminError

# Where `--broker` comes from when not given: POPGATE_BROKERS, else the proxy's own POPGATE_BROKER (set in every
# proxy pod, where docs/DEPLOY.md runs `popgate stats`). Both are lists read as the proxy reads its variable.
BROKER_VARIABLES = ("POPGATE_BROKERS", "POPGATE_BROKER")
# The exit code of `stats` when its figures do not cover every broker (sysexits.h EX_TEMPFAIL: try again later;
# 69, EX_UNAVAILABLE, already means that nothing listens at --endpoint). docs/SDK.md, "Exit codes".
BROKERS_MISSING = 75


def env_brokers() -> list[str]:
    """The ``NAME=HOST:PORT`` entries of the first of BROKER_VARIABLES that is set (comma or space separated)."""
    for variable in BROKER_VARIABLES:
        entries = os.environ.get(variable, "").replace(",", " ").split()
        if entries:
            return entries
    return []


def broker_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker",
        action="append",
        default=None,
        help="NAME=HOST:PORT of a broker (repeatable; env POPGATE_BROKERS, else the proxy's POPGATE_BROKER:"
        " comma-separated)",
    )
    parser.add_argument(
        "--broker-token",
        default=os.environ.get("POPGATE_BROKER_TOKEN", ""),
        help="the brokers' shared token, when they require one (env POPGATE_BROKER_TOKEN, as the proxy's)",
    )
    parser.add_argument(
        "--broker-tls-ca",
        default=os.environ.get("POPGATE_BROKER_TLS_CA", ""),
        help="PEM CA bundle of brokers serving TLS, verified by each --broker HOST (env POPGATE_BROKER_TLS_CA, as"
        " the proxy's)",
    )
    parser.set_defaults(default_brokers=env_brokers())


def proxy_options(parser: argparse.ArgumentParser) -> None:
    """-e/--endpoint and the v2 credentials and TLS options, to ask a proxy's admin service; no proxy is asked when
    neither the flag nor POPGATE_ENDPOINT is given."""
    client_options(parser)
    for action in parser._actions:
        if action.dest == "endpoint":
            action.default = os.environ.get("POPGATE_ENDPOINT", "")
            action.help = (
                "proxy HOST:PORT: without --broker the figures come through it, with --broker it is asked which"
                " brokers exist (env POPGATE_ENDPOINT; default: none)"
            )


def add_parsers(sub: Sub) -> None:
    stats = sub.add_parser("stats", help="lag per topic and consumer group (asks the brokers)")
    broker_options(stats)
    proxy_options(stats)
    stats.add_argument("-t", "--topic", default="", help="only this topic")
    stats.add_argument("-g", "--group", default="", help="only this consumer group")
    stats.add_argument("--timeout", type=POSITIVE_DURATION, default=3.0, help="per-broker deadline")
    json_option(stats)
    stats.set_defaults(handler=stats_command)


@dataclass(frozen=True, slots=True)
class Broker:
    name: str
    target: str
    token: str = ""  # the brokers' shared token (their --broker-token), sent as the proxy sends it
    tls_ca: bytes | None = None  # PEM roots: the broker serves TLS (its --tls-cert), verified by the target's host

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((TOKEN_KEY, self.token),) if self.token else ()


def brokers_of(args: argparse.Namespace) -> list[Broker]:
    out = []
    try:
        tls_ca = Path(args.broker_tls_ca).read_bytes() if args.broker_tls_ca else None
    except OSError as exc:
        raise ValueError(f"--broker-tls-ca {args.broker_tls_ca}: {exc.strerror}") from None
    for text in args.broker or args.default_brokers:
        name, sep, target = text.partition("=")
        if not sep or ":" not in target:
            raise ValueError(f"--broker {text!r}: expected NAME=HOST:PORT")
        out.append(Broker(name, target, args.broker_token, tls_ca))
    if not out:
        raise ValueError(
            "give at least one --broker NAME=HOST:PORT (as printed by `popgate up`), or set POPGATE_BROKERS"
        )
    return out


def broker_channel(broker: Broker, options: Sequence[tuple[str, int]] = ()) -> grpc.Channel:
    """A channel to `broker`, over TLS when it has a CA; `options` are grpc channel options added."""
    # grpc's default 4 MiB receive limit is below what a broker may answer: a ListMessages page is cut at the
    # broker's --max-pop-bytes (8 MiB) but always holds one message, itself up to 4 MiB of body; a Stats answer
    # grows with topics. The broker bounds its answers, so this client takes whatever it is sent.
    options = [("grpc.max_receive_message_length", -1), *options]
    if broker.tls_ca is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=broker.tls_ca)
        return grpc.secure_channel(broker.target, credentials, options=options)
    return grpc.insecure_channel(broker.target, options=options)


def fetch_stats(
    brokers: list[Broker],
    request: bpb.StatsRequest,
    timeout: float,
    *,
    failures: dict[str, grpc.StatusCode] | None = None,
) -> dict[str, bpb.StatsResponse]:
    """Each broker's Stats; those that failed are left out, their status codes put in `failures` when given
    (UNAVAILABLE: not reachable; UNAUTHENTICATED: it wants --broker-token; ...)."""
    out: dict[str, bpb.StatsResponse] = {}
    for broker in brokers:
        with broker_channel(broker) as channel:
            try:
                stub = bpb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
                out[broker.name] = stub.Stats(request, timeout=timeout, metadata=broker.metadata)
            except grpc.RpcError as exc:
                if failures is not None:
                    failures[broker.name] = exc.code()
    return out


@dataclass
class Lag:
    ready: int = 0
    inflight: int = 0
    lag: int = 0
    oldest_ms: int = 0
    brokers: int = 0


def lag_rows(responses: dict[str, bpb.StatsResponse]) -> dict[tuple[str, str], Lag]:
    """(topic, group) -> lag summed over queues and brokers; the oldest un-acked store time over all."""
    rows: dict[tuple[str, str], Lag] = defaultdict(Lag)
    for response in responses.values():
        seen = set()
        for g in response.groups:
            row = rows[g.topic, g.group]
            row.ready += g.ready
            row.inflight += g.inflight
            row.lag += g.lag
            if g.oldest_unacked_store_ms and (not row.oldest_ms or g.oldest_unacked_store_ms < row.oldest_ms):
                row.oldest_ms = g.oldest_unacked_store_ms
            if (g.topic, g.group) not in seen:
                seen.add((g.topic, g.group))
                row.brokers += 1
    return dict(rows)


@dataclass(frozen=True)
class Coverage:
    """Which brokers a sum over brokers covers: those asked that answered, and the missing ones."""

    asked: list[str]
    failed: dict[str, str] = field(default_factory=dict)  # asked, did not answer: name -> why (a status code)
    not_asked: list[str] = field(default_factory=list)  # the proxy routes to them; no address was given

    @classmethod
    def of(cls, asked: list[str], failed: dict[str, str], routed: set[str] | None) -> Coverage:
        """routed: the brokers the proxy routes to (None: no proxy was asked)."""
        return cls(list(asked), dict(failed), sorted((routed or set()) - set(asked)))

    @property
    def answered(self) -> int:
        return len(self.asked) - len(self.failed)

    @property
    def known(self) -> int:
        return len(self.asked) + len(self.not_asked)

    @property
    def missing(self) -> list[str]:
        return sorted({*self.failed, *self.not_asked})

    def explain(self) -> list[str]:
        """What to print on stderr, one line each, naming every missing broker."""
        lines = [
            f"broker {name}: the proxy routes to it, but its address was not given (--broker {name}=HOST:PORT)"
            for name in self.not_asked
        ]
        if self.missing:
            lines.append(
                f"{len(self.missing)} of {self.known} brokers missing: {', '.join(self.missing)}; the figures leave"
                f" them out (exit code {BROKERS_MISSING})"
            )
        return lines


def err(text: str) -> None:
    error_console().print(text)


def failure(code: grpc.StatusCode) -> str:
    """A broker call's status code, said with what it usually means here."""
    meaning = {
        grpc.StatusCode.UNIMPLEMENTED: " (not a popgate broker: the proxy's address, perhaps?)",
        grpc.StatusCode.UNAUTHENTICATED: " (the broker wants --broker-token)",
    }
    return str(code.name) + meaning.get(code, "")


def name_column(table: Table, name: str) -> None:
    """A column whose cells (ids, topics, groups) are never cut short: folded in a narrow terminal."""
    table.add_column(name, overflow="fold")


def given_brokers(args: argparse.Namespace) -> list[Broker]:
    """The brokers given (--broker, else the environment); none when --endpoint is given instead, ValueError when
    neither is."""
    if not args.endpoint and not (args.broker or args.default_brokers):
        raise ValueError(
            "give -e/--endpoint (the proxy asks its brokers), or each --broker NAME=HOST:PORT (as printed by"
            " `popgate up`; or POPGATE_BROKERS)"
        )
    return brokers_of(args) if args.broker or args.default_brokers else []


def routed_brokers(args: argparse.Namespace, responses: dict[str, bpb.StatsResponse]) -> set[str] | None:
    """The brokers the proxy at --endpoint routes to (None: none asked). On a proxy without the admin service, for
    a topic that exists when one does (QueryRoute). A proxy that does not tell is said on stderr and None
    returned: `stats` then cannot vouch that no broker is missing (its exit code says so)."""
    if not args.endpoint:
        return None
    known = sorted(q.topic for r in responses.values() for q in r.queues if not q.topic.startswith("%"))
    try:
        with ProxyAdmin(args, args.timeout) as proxy:
            return proxy.broker_names(args.topic or (known[0] if known else PROBE_TOPIC))
    except (ProxyAdminError, NothingListens) as exc:  # the brokers answered: their figures are still shown
        err(f"popgate {args.parser.prog.split()[-1]}: {exc}")
        return None


def _from_brokers(
    args: argparse.Namespace, brokers: list[Broker], request: bpb.StatsRequest
) -> tuple[dict[str, bpb.StatsResponse], Coverage, bool]:
    """Each given broker's Stats, the coverage (with the proxy's list given --endpoint), and whether the proxy
    failed to tell which brokers exist."""
    failures: dict[str, grpc.StatusCode] = {}
    responses = fetch_stats(brokers, request, args.timeout, failures=failures)
    for broker in brokers:
        if broker.name in failures:  # as `dlq list`: UNAVAILABLE did not answer, UNAUTHENTICATED refused, ...
            err(f"popgate stats: broker {broker.name} at {broker.target}: {failure(failures[broker.name])}")
    routed = routed_brokers(args, responses)
    coverage = Coverage.of([b.name for b in brokers], {n: c.name for n, c in failures.items()}, routed)
    return responses, coverage, bool(args.endpoint) and routed is None


def _through_proxy(
    args: argparse.Namespace, request: bpb.StatsRequest
) -> tuple[dict[str, bpb.StatsResponse], Coverage]:
    """Every broker's Stats through the proxy's admin service; ProxyAdminError when the proxy fails."""
    with ProxyAdmin(args, args.timeout) as proxy:
        gathered = proxy.stats(request)
    for name, code in sorted(gathered.failures.items()):
        err(f"popgate stats: broker {name} (asked by the proxy at {args.endpoint}): {code}")
    asked = sorted({*gathered.answers, *gathered.failures})
    return gathered.answers, Coverage.of(asked, gathered.failures, None)


def _cut_brokers(responses: dict[str, bpb.StatsResponse]) -> list[str]:
    """The brokers that left groups out of their answer to fit their gRPC message limit, each named on stderr:
    the figures then leave groups out, never silently (tests/unit/sdk/test_coverage.py::
    test_a_broker_that_left_groups_out_of_its_answer_is_named_and_the_exit_code_says_so)."""
    cut = sorted(name for name, response in responses.items() if response.cut)
    for name in cut:
        err(
            f"popgate stats: broker {name} left groups out of its answer to keep it under its gRPC message limit;"
            f" ask with -t TOPIC or -g GROUP (exit code {BROKERS_MISSING})"
        )
    return cut


def stats_command(args: argparse.Namespace) -> int:
    brokers = given_brokers(args)
    request = bpb.StatsRequest(topic=args.topic, group=args.group)
    unverified = False
    if brokers:
        responses, coverage, unverified = _from_brokers(args, brokers, request)
    else:
        try:
            responses, coverage = _through_proxy(args, request)
        except ProxyAdminError as exc:
            err(f"popgate stats: {exc}")
            json_error(args.json, f"popgate stats: {exc}")
            return 1
    for line in coverage.explain():
        err(f"popgate stats: {line}")
    cut = _cut_brokers(responses)
    code = BROKERS_MISSING if coverage.missing or unverified or cut else 0
    rows = lag_rows(responses)
    topics = stored_messages(responses, rows if args.group else None)
    now_ms = int(time.time() * 1000)
    if args.json:
        print_json(_stats_document(rows, topics, coverage, now_ms, cut))
        return code
    if not responses:
        return code
    table = Table(title=f"lag per topic and group ({coverage.answered} of {coverage.known} brokers)")
    for column in ("topic", "group"):
        name_column(table, column)
    for column in ("lag", "ready", "inflight", "oldest un-acked", "brokers"):
        table.add_column(column, justify="right", no_wrap=True)  # kept whole: the names fold instead
    for (topic, group), row in sorted(rows.items()):
        age = f"{lag_seconds(row.oldest_ms, now_ms):.1f} s" if row.oldest_ms else "-"
        table.add_row(topic, group, str(row.lag), str(row.ready), str(row.inflight), age, str(row.brokers))
    print_table(table)
    summary = Table(title="stored messages")
    name_column(summary, "topic")
    summary.add_column("messages", justify="right", no_wrap=True)
    for topic, count in sorted(topics.items()):
        summary.add_row(topic, str(count))
    print_table(summary)
    return code


def stored_messages(
    responses: dict[str, bpb.StatsResponse], rows: dict[tuple[str, str], Lag] | None = None
) -> dict[str, int]:
    """Messages stored per topic over the brokers; with `rows` (a group's), only the topics it reads."""
    topics: dict[str, int] = defaultdict(int)
    for response in responses.values():
        for q in response.queues:
            topics[q.topic] += q.max_offset - q.min_offset
    if rows is not None:
        topics = {topic: count for topic, count in topics.items() if any(t == topic for t, _ in rows)}
    return dict(topics)


def _stats_document(
    rows: dict[tuple[str, str], Lag],
    topics: dict[str, int],
    coverage: Coverage,
    now_ms: int,
    cut: list[str],
) -> dict[str, Any]:
    """`stats --json`: the two tables and which brokers answered, as one document (docs/SDK.md)."""
    groups = [
        {
            "topic": topic,
            "group": group,
            "lag": row.lag,
            "ready": row.ready,
            "inflight": row.inflight,
            "oldest_unacked_age_s": round(lag_seconds(row.oldest_ms, now_ms), 3) if row.oldest_ms else None,
            "brokers": row.brokers,
        }
        for (topic, group), row in sorted(rows.items())
    ]
    return {
        "brokers": {
            "asked": len(coverage.asked),
            "answered": coverage.answered,
            "failed": coverage.failed,
            "not_asked": coverage.not_asked,
            "missing": coverage.missing,
            "cut": cut,
        },
        "groups": groups,
        "topics": [{"topic": topic, "messages": count} for topic, count in sorted(topics.items())],
    }
