"""The commands of pop with notify: what `proxy.receive.notify.NotifyRun` asks its driver to do."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from popgate_pb import broker_pb2 as bpb

from popgate_contract.errors import DomainError


@dataclass(frozen=True, slots=True)
class Pop:
    """Pop `broker`: poll 0, or held for `poll_ms` after a hand-off to long polling."""

    broker: str
    poll_ms: int = 0


@dataclass(frozen=True, slots=True)
class Notify:
    """Send a Notification to `broker`, held by it for `poll_ms`."""

    broker: str
    poll_ms: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel whatever is outstanding at `broker` (a Notification or a Pop)."""

    broker: str


@dataclass(frozen=True, slots=True)
class PassOn:
    """`broker` answered has_message and this run will not Pop it: hand that answer back, so that the broker passes
    its wake on to another request it holds (an arrival wakes one held request per message)."""

    broker: str


@dataclass(frozen=True, slots=True)
class Finish:
    """Answer the client: messages, or empty (`outcome` says why), or an error to raise."""

    messages: Sequence[bpb.PoppedMessage]
    outcome: str  # "messages", "empty", "closing", "error"
    error: DomainError | None = None


@dataclass(frozen=True, slots=True)
class Rewatch:
    """At `at`, report `rewatch(broker)`: a broker whose request failed may be back (a restart) by then."""

    broker: str
    at: float


@dataclass(frozen=True, slots=True)
class AwaitUp:
    """Report `rewatch(broker, healthy=True)` once the health checks see `broker` up (at once if they do now)."""

    broker: str


Command = Pop | Notify | Cancel | PassOn | Finish | Rewatch | AwaitUp
