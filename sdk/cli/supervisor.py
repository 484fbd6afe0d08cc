"""`popgate up`'s supervision: a child that dies is started again on its address and data directory.

`Supervision` is the policy, pure and clock-free (tests/unit/sdk/test_supervisor.py): when to restart a child,
when to give up, and each child's state and restart count for the live view. `Supervisor` is its thin driver: one
thread that hears of deaths (`Child.on_exit`), waits out each backoff on its queue, and restarts children
through `Cluster.restart_child`. The same thread starts every restarted child, because a child started with
`die_with_parent` gets SIGTERM when the thread that forked it ends (PR_SET_PDEATHSIG): the thread lives until
`popgate up` has stopped the cluster (`close`, then `release`).
"""

from __future__ import annotations

import enum
import logging
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from .cluster import Child, Cluster, ClusterError, ClusterInterrupted, ended

log = logging.getLogger(__name__)


class State(enum.Enum):
    UP = "up"
    WAITING = "restarting"  # dead, its restart due after the backoff
    STARTING = "starting"  # started again, not ready yet
    GAVE_UP = "gave up"


@dataclass(frozen=True)
class Backoff:
    """How `popgate up` restarts a child that died.

    The k-th failure in a row waits ``first_s * 2**(k-1)``, at most `max_s`, before the restart. A failure is a
    death, or a restart that did not become ready; a child that stayed up `stable_s` before dying starts the count
    again. After `max_failures` failures in a row the child is given up (and `popgate up` stops the cluster).
    """

    first_s: float = 0.5
    max_s: float = 10.0
    stable_s: float = 10.0
    max_failures: int = 5

    def delay(self, failures: int) -> float:
        return float(min(self.max_s, self.first_s * 2 ** max(0, failures - 1)))


@dataclass(frozen=True)
class Status:
    """One child as the live view shows it."""

    name: str
    state: State = State.UP
    restarts: int = 0  # restarts that reached ready
    failures: int = 0  # failures in a row (see Backoff)
    up_since: float = 0.0
    due: float = 0.0  # when WAITING: when the restart is due


@dataclass
class Supervision:
    """The restart policy over a set of children, by name; times are any monotonic clock's, passed in."""

    backoff: Backoff = field(default_factory=Backoff)
    children: dict[str, Status] = field(default_factory=dict)

    def ready(self, name: str, at: float) -> None:
        """`name` reported ready at `at` (its first start, or a restart)."""
        old = self.children.get(name)
        if old is None:
            self.children[name] = Status(name, up_since=at)
            return
        restarts = old.restarts + (old.state is not State.UP)
        self.children[name] = replace(old, state=State.UP, restarts=restarts, up_since=at, due=0.0)

    def died(self, name: str, at: float) -> float | None:
        """`name` ended on its own at `at`: the delay before its restart, or None when it is given up."""
        old = self.children.get(name, Status(name, up_since=at))
        stable = old.state is State.UP and at - old.up_since >= self.backoff.stable_s
        return self._failed(replace(old, failures=0 if stable else old.failures), at)

    def start_failed(self, name: str, at: float) -> float | None:
        """A restart of `name` did not become ready: the delay before the next try, or None (given up)."""
        return self._failed(self.children[name], at)

    def starting(self, name: str) -> None:
        self.children[name] = replace(self.children[name], state=State.STARTING)

    def _failed(self, status: Status, at: float) -> float | None:
        failures = status.failures + 1
        if failures > self.backoff.max_failures:
            self.children[status.name] = replace(status, state=State.GAVE_UP, failures=failures)
            return None
        delay = self.backoff.delay(failures)
        self.children[status.name] = replace(status, state=State.WAITING, failures=failures, due=at + delay)
        return delay

    def due(self, at: float) -> list[str]:
        """The children whose restart is due at `at`, soonest first."""
        waiting = [s for s in self.children.values() if s.state is State.WAITING and s.due <= at]
        return [s.name for s in sorted(waiting, key=lambda s: s.due)]

    def next_due(self) -> float | None:
        dues = [s.due for s in self.children.values() if s.state is State.WAITING]
        return min(dues) if dues else None

    def view(self) -> list[Status]:
        return list(self.children.values())


_CLOSE = object()


class Supervisor:
    """The driver of `Supervision` over a started `Cluster` (see the module docstring)."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        backoff: Backoff | None = None,
        on_death: Callable[[Child, str, float], None] = lambda child, how, delay: None,
        on_restart: Callable[[Child], None] = lambda child: None,
        on_give_up: Callable[[Child, str], None] = lambda child, why: None,
    ) -> None:
        """on_death: a child ended (how, and the seconds until its restart); on_restart: it is ready again (its
        addresses may be read); on_give_up: it is given up, with what to report. All are called from the
        supervisor's thread."""
        self._cluster = cluster
        self._policy = Supervision(backoff or Backoff())
        self._lock = threading.Lock()  # the policy is read by the live view's thread
        self._events: queue.Queue[object] = queue.Queue()
        self._closing = threading.Event()
        self._idle = threading.Event()  # the thread restarts nothing more
        self._released = threading.Event()
        self._on_death = on_death
        self._on_restart = on_restart
        self._on_give_up = on_give_up
        self._thread = threading.Thread(target=self._run, name="popgate-supervisor", daemon=True)

    def start(self) -> None:
        now = time.monotonic()
        with self._lock:
            for child in self._cluster.children():
                self._policy.ready(child.name, now)
        for child in self._cluster.children():
            child.on_exit(self._died)
        self._thread.start()

    def statuses(self) -> list[Status]:
        with self._lock:
            return self._policy.view()

    def close(self, timeout_s: float = 10.0) -> None:
        """Restart nothing more, and return once a restart under way was cut short (bounded by `timeout_s`):
        stopping the cluster after this stops every child. The thread then waits in `release`, so that what it
        started stays up until the cluster stops it in order."""
        self._closing.set()
        self._events.put(_CLOSE)
        if self._thread.is_alive():
            self._idle.wait(timeout_s)

    def release(self, timeout_s: float = 10.0) -> None:
        """Let the thread end (after the cluster was stopped): its children would get SIGTERM now."""
        self._released.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _died(self, child: Child, code: int) -> None:
        self._events.put((child, ended(code)))

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                with self._lock:
                    due = self._policy.next_due()
                timeout = None if due is None else max(0.0, due - time.monotonic())
                try:
                    event = self._events.get(timeout=timeout)
                except queue.Empty:
                    event = None
                if event is _CLOSE:
                    break
                try:
                    if isinstance(event, tuple):
                        self._record_death(*event)
                    self._restart_due()
                except Exception:  # a bug must not end supervision unseen: logged, and the loop goes on
                    log.exception("supervising the cluster's children failed")
        finally:
            self._idle.set()
            self._released.wait()

    def _record_death(self, child: Child, how: str) -> None:
        with self._lock:
            delay = self._policy.died(child.name, time.monotonic())
        if delay is None:
            self._give_up(child, how)
        else:
            log.info("%s %s; restarting it in %.1f s", child.name, how, delay)
            self._on_death(child, how, delay)

    def _restart_due(self) -> None:
        with self._lock:
            names = self._policy.due(time.monotonic())
        for name in names:
            if self._closing.is_set():
                return
            self._restart(self._cluster.child(name))

    def _restart(self, child: Child) -> None:
        with self._lock:
            self._policy.starting(child.name)
        try:
            self._cluster.restart_child(child.name, stop=self._closing)
        except ClusterInterrupted:
            return
        except (ClusterError, OSError, subprocess.SubprocessError) as exc:
            child.kill()  # a child that stayed silent is not left running beside its next try
            with self._lock:
                delay = self._policy.start_failed(child.name, time.monotonic())
            if delay is None:
                self._give_up(child, str(exc))
            return
        with self._lock:
            self._policy.ready(child.name, time.monotonic())
        child.on_exit(self._died)
        self._on_restart(child)

    def _give_up(self, child: Child, how: str) -> None:
        tail = "\n  ".join(child.lines[-5:])
        with self._lock:
            failures = self._policy.children[child.name].failures
        again = f" (given up after {failures} failures in a row)" if failures > 1 else ""
        self._on_give_up(child, f"{child.name} {how}{again}; last output:\n  {tail}")


def describe(statuses: Sequence[Status], now: float) -> str:
    """The live view's processes line: ``b1 up  b2 restarting in 1.5s (3 restarts)  proxy up``."""
    parts = []
    for s in statuses:
        text = f"{s.name} {s.state.value}"
        if s.state is State.WAITING:
            text += f" in {max(0.0, s.due - now):.1f}s"
        if s.restarts:
            text += f" ({s.restarts} restart{'s' if s.restarts != 1 else ''})"
        parts.append(text)
    return "  ".join(parts)
