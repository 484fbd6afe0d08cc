"""The receive seam: how one client ReceiveMessage becomes broker calls is a `ReceiveStrategy`.

The core calls `receive()` and does not care how it is served. Three implement it (docs/ARCHITECTURE.md §3):
`proxy.receive.coupled.LongPollStrategy` (coupled long polling: one Pop to one live broker, held for the
client's long-polling time), `proxy.receive.notify_driver.NotifyStrategy` (pop with notify) and
`proxy.receive.adaptive_driver.AdaptiveStrategy`, which asks `proxy.receive.adaptive.AdaptivePolicy` which of
the two serves each request. This module holds what they share: the request, the result, and the
one waiter that ends their broker calls when the proxy closes.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from popgate_pb import broker_pb2 as bpb

R = TypeVar("R")
MIN_ATTEMPT_S = 0.05  # less time than this left: no further broker attempt, and a broker call gets at least this
# A broker call that does not wait (poll 0) gets at most this long (or the broker timeout if shorter): a broker hung
# but not yet failed by its health checks then counts as failed and the receive asks the next one in its time.
IMMEDIATE_TIMEOUT_S = 0.5


@dataclass(frozen=True, slots=True)
class ReceiveRequest:
    topic: str
    group: str
    filter: str  # broker form: "*" or "a||b"
    batch: int
    invisible_ms: int
    poll_s: float  # how long a broker may hold the request (already clamped and cut to the deadline)
    deadline: float  # loop.time() by which the answer must be on its way
    max_fifo: int = 0  # > 0: at most this many FIFO messages (a receive joining a client's several: each one's share)

    def __post_init__(self) -> None:
        # Every held receive keeps its request: a group's many receives share one string of each name.
        object.__setattr__(self, "topic", sys.intern(self.topic))
        object.__setattr__(self, "group", sys.intern(self.group))

    def pop_request(self, poll_ms: int) -> bpb.PopRequest:
        """The broker Pop for this receive, held at most `poll_ms` there."""
        return bpb.PopRequest(
            topic=self.topic,
            group=self.group,
            filter=self.filter,
            max_messages=self.batch,
            invisible_ms=self.invisible_ms,
            poll_ms=poll_ms,
            max_fifo=self.max_fifo,
        )


def _nothing() -> None:
    pass


def _nothing_but(frame: range) -> None:
    pass


@dataclass(slots=True)
class ReceiveResult:
    """What a receive got. The caller calls ``release()`` once the answer is written to the client:
    a strategy may leave broker requests outstanding until then (pop with notify cancels the other
    brokers' Notifications there, so the answer's frames do not queue behind the cancel frames).
    ``give_back()`` instead of answering: the broker puts the messages back, ready at once."""

    messages: list[bpb.PoppedMessage]
    outcome: str  # "messages", "empty" (poll timed out), "closing" (proxy shutting down)
    release: Callable[[], None] = _nothing
    give_back: Callable[[], None] = _nothing
    # Only the messages of `frame`, in a stalled write, still take memory until `release`: see `hand_back_unread`.
    keep_only: Callable[[range], None] = _nothing_but
    _body_sizes: list[int] | None = field(default=None, init=False, repr=False)

    def body_sizes(self) -> list[int]:
        """Each message's body size in bytes, read from the messages once for all that need it (the proxy's
        accounting of the answer, its frames)."""
        sizes = self._body_sizes
        if sizes is None or len(sizes) != len(self.messages):
            sizes = self._body_sizes = [len(popped.stored.message.body) for popped in self.messages]
        return sizes

    def hand_back_unread(self, writing: range) -> None:
        """The client stopped reading the answer: its messages go back to their broker now and nothing here keeps
        them alive (with upb one PoppedMessage keeps its whole Pop answer alive, so neither the list nor the Pop call
        is kept); only the messages `writing` (the frame in grpc's stalled write) stay counted until `release` —
        tests/unit/proxy/test_core_receive.py::test_an_answer_past_its_write_deadline_counts_only_the_frame_grpc_still_holds."""
        self.give_back()
        self.give_back = _nothing  # it held the Pop call, and so its answer
        self.keep_only(writing)
        self.messages.clear()


class ReceiveStrategy(Protocol):
    mode: str

    def receive(self, request: ReceiveRequest, closing: asyncio.Event) -> Awaitable[ReceiveResult]: ...

    def broker_up(self, broker: str) -> None:
        """`broker` came up (discovery added it, moved it, or it is back from down): receives held now that do not
        watch it start to, as the receive mode promises for every live broker (docs/RECEIVE.md)."""


class EndsReceives(Protocol):
    """Told when each receive it chose a strategy for ends (`proxy.receive.adaptive.AdaptivePolicy`)."""

    def end(self, group: str, *, now: float) -> None: ...


class ServesForPolicy(Protocol):
    """A strategy the adaptive mode picks per request: it tells `policy` when the receive ends."""

    mode: str

    def receive(
        self, request: ReceiveRequest, closing: asyncio.Event, *, policy: EndsReceives | None = None
    ) -> Awaitable[ReceiveResult]: ...

    def broker_up(self, broker: str) -> None: ...


class OnClose(Generic[R]):
    """One waiter task on the proxy's `closing` event for everything `registered`: on close, ``act`` is called
    for each. A held receive is the proxy's unit of memory (10,000 of them is an ordinary load): a waiter task
    per receive on the event would cost more than the rest of the receive's Python state."""

    def __init__(self, act: Callable[[R], None], name: str) -> None:
        self.registered: set[R] = set()
        self._act = act
        self._name = name
        self._task: asyncio.Task[None] | None = None

    def watch(self, closing: asyncio.Event) -> None:
        """Start the waiter unless it is running (again after it has fired)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._wait(closing), name=self._name)

    async def _wait(self, closing: asyncio.Event) -> None:
        await closing.wait()
        for item in list(self.registered):
            self._act(item)
