"""What the NotifyRun tests share: a run over three brokers, started or notifying, and reading its answer."""

from __future__ import annotations

from popgate_pb import broker_pb2 as bpb

from proxy.receive.notify import NotifyRun
from proxy.receive.notify_commands import Command, Finish, Notify
from tests.unit.proxy.fakes import popped

BROKERS = ("b1", "b2", "b3")


def started(poll_end: float = 10.0) -> tuple[NotifyRun, list[Command]]:
    run = NotifyRun(BROKERS, poll_end)
    return run, run.start()


def notifying(now: float = 0.0) -> NotifyRun:
    run, _ = started()
    cmds = run.popped("b1", [], polling_full=False, now=now)
    assert cmds == [Notify(b, 10_000) for b in BROKERS]
    return run


def finish(cmds: list[Command]) -> Finish:
    assert isinstance(cmds[-1], Finish), cmds
    return cmds[-1]


def message(mid: str) -> list[bpb.PoppedMessage]:
    return [popped("b2", mid)]
