"""One operation at every broker, and what the command says of its outcome (`fan_out`, `finish`): through the
proxy's admin service, or at each `--broker` directly. A broker that refused the change did not make it ("NOT on");
one whose call ended without an answer may have ("not known whether applied") — tests/unit/sdk/
test_operate_outcomes.py. The exit code is BROKERS_MISSING (75) when some broker did not answer or refused."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import grpc
from popgate_pb import broker_pb2_grpc as bpb_grpc

from popgate_contract.trailer import NEVER_CONNECTED

from .admin import BROKERS_MISSING, broker_channel, brokers_of
from .proxy_admin import ProxyAdmin

# A broker's failure whose change it may still have made (its answer came too late), as an older proxy reports it
# (a newer one says so in BrokerFailure.outcome_unknown).
UNKNOWN_OUTCOME = ("DEADLINE_EXCEEDED", "PROXY_TIMEOUT")
# Failures of a call made to a broker directly that may have applied it: it reached the broker and ended without an
# answer (UNAVAILABLE or CANCELLED other than NEVER_CONNECTED), or the broker failed midway.
CUT_SHORT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


@dataclass
class Fanned:
    """What every broker answered to one operation, and the ones that did not (name -> code and message)."""

    answers: list[Any] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)  # of `failures`, those that may have applied it


def fan_out(args: argparse.Namespace, method: str, request: Any, what: str) -> Fanned:
    """`method` at every broker: through the proxy, or at each --broker given directly."""
    out = Fanned()
    if args.broker:
        for broker in brokers_of(args):
            with broker_channel(broker) as channel:
                stub = bpb_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
                try:
                    out.answers.append(getattr(stub, method)(request, timeout=args.timeout, metadata=broker.metadata))
                except grpc.RpcError as exc:
                    out.failures[broker.name] = f"{exc.code().name}: {exc.details()}"
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED or (
                        exc.code() in CUT_SHORT and NEVER_CONNECTED not in (exc.details() or "")
                    ):
                        out.unknown.add(broker.name)
        return out
    with ProxyAdmin(args, args.timeout) as admin:
        reply = admin.call(method, request, what)
    out.answers = list(reply.answers) if hasattr(reply, "answers") else [reply]
    out.failures = {f.broker: f"{f.code}: {f.message}" for f in reply.failures}
    out.unknown = {f.broker for f in reply.failures if f.outcome_unknown or f.code in UNKNOWN_OUTCOME}
    return out


def finish(
    args: argparse.Namespace, fanned: Fanned, document: dict[str, Any], lines: list[str], *, change: bool
) -> int:
    """Print the outcome; the exit code: 0, BROKERS_MISSING when some broker did not answer, 1 when none did."""
    if args.json:
        document["failures"] = fanned.failures
        document["outcome_unknown"] = sorted(fanned.unknown)  # of the failures, those that may have applied it
        print(json.dumps(document, indent=2))
    else:
        for line in lines:
            print(line)
    for name, why in sorted(fanned.failures.items()):
        said = "did not answer" if name in fanned.unknown or why.startswith("UNAVAILABLE") else "refused it"
        print(f"{args.parser.prog}: broker {name} {said}: {why}", file=sys.stderr)
    if not fanned.failures:
        return 0
    late = sorted(fanned.unknown)
    refused = sorted(set(fanned.failures) - set(late))
    if change and late:
        # The broker may have applied it, or still be applying it (a large topic's deletion): not "NOT applied" —
        # tests/integration/sdk/test_operate.py::test_dangerous_operations_need_confirmation_and_name_a_broker_down,
        # tests/unit/sdk/test_operate_outcomes.py.
        timed_out = any(fanned.failures[name].split(":", 1)[0] in UNKNOWN_OUTCOME for name in late)
        why = (
            f"no answer within --timeout ({args.timeout:g} s), and a large topic takes longer; run the same command"
            " again with a longer --timeout"
            if timed_out
            else "its call ended without an answer; run the same command again once it is back"
        )
        print(
            f"{args.parser.prog}: not known whether applied on {', '.join(late)}: {why} (it is safe to repeat)",
            file=sys.stderr,
        )
    if change and fanned.answers and refused:
        done = ", ".join(sorted(a.broker for a in fanned.answers))
        print(
            f"{args.parser.prog}: applied on {done} only, NOT on {', '.join(refused)}: run the"
            f" same command again once they are back (it is safe to repeat); exit code {BROKERS_MISSING}",
            file=sys.stderr,
        )
    return BROKERS_MISSING if fanned.answers else 1
