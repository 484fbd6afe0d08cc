"""Freed heap memory goes back to the system after a burst (glibc's `malloc_trim`), for the broker and the proxy.

glibc keeps what a process freed for its next allocations: after a burst of large sends a process stays at its
high-water mark (not a leak). In Kubernetes that is memory the pod is charged for: its limit is reached sooner
and a memory-based autoscaler never scales it back down. `malloc_trim(0)` after such a burst gives it back
(tests/integration/proxy/test_memory.py; the sizes measured are in docs/PROXY.md).

The decision is pure (`TrimPolicy`); `MemoryTrimmer` is a daemon thread that samples the resident size every
few seconds and trims only when it is well above its size at rest: a steady process never trims. Without
glibc (no `malloc_trim`) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

INTERVAL_S = 5.0
SPACING_S = 15.0
GROW_BYTES = 64 * 1024 * 1024
RETRY_S = 60.0
MAX_RETRY_S = 3600.0
_PAGE = os.sysconf("SC_PAGE_SIZE")


class TrimPolicy:
    """When to trim, from samples of the resident size: when it is `grow_bytes` above the floor (the least
    seen: at rest), at most once per `spacing_s`. A trim that gave back little (the memory is in use: held
    receives, a backlog being served) is not tried again until the size grew by `grow_bytes` more, or for
    `retry_s`: a trim during a burst gives back only part of it, and the next one, after the burst, the rest;
    memory that stayed in use a while is given back once it is free (tests/unit/process/test_memory.py). Each
    trim in a row that gave back little doubles that wait, up to `max_retry_s`: a process whose state grew for
    good (each trim's full collection stops its event loop a while) tries again ever more seldom —
    test_memory.py::test_memory_in_use_for_good_is_tried_again_ever_more_seldom."""

    def __init__(
        self,
        grow_bytes: int = GROW_BYTES,
        spacing_s: float = SPACING_S,
        retry_s: float = RETRY_S,
        max_retry_s: float = MAX_RETRY_S,
    ) -> None:
        self.grow_bytes = grow_bytes
        self.spacing_s = spacing_s
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self._wait_s = retry_s  # the hold after the last trim (doubled by each that gave back little)
        self.floor: int | None = None
        self._hold_until: int = 0  # no trim below this size (after one that gave back little), until retry_s
        self._last_s: float | None = None

    def due(self, resident: int, now_s: float) -> bool:
        if self.floor is None or resident < self.floor:
            self.floor = resident
        if self._last_s is not None and now_s - self._last_s < self.spacing_s:
            return False
        held = self._last_s is not None and now_s - self._last_s < self._wait_s
        return resident >= max(self.floor + self.grow_bytes, self._hold_until if held else 0)

    def trimmed(self, before: int, after: int, now_s: float) -> None:
        little = before - after < self.grow_bytes // 4
        retried = before < self._hold_until  # due only because the hold's wait ended: the memory did not grow
        self._wait_s = min(self.max_retry_s, self._wait_s * 2) if little and retried else self.retry_s
        self._last_s = now_s
        self.floor = min(self.floor if self.floor is not None else after, after)
        self._hold_until = after + self.grow_bytes if little else 0


def resident_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        trim: Callable[[int], int] = libc.malloc_trim  # type: ignore[union-attr]
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    return trim


class MemoryTrimmer:
    """A daemon thread applying `TrimPolicy` every `interval_s`; a context manager (stopped on exit)."""

    def __init__(self, *, interval_s: float = INTERVAL_S, policy: TrimPolicy | None = None) -> None:
        self.interval_s = interval_s
        self.policy = policy or TrimPolicy()
        self._trim = _malloc_trim()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="malloc-trim", daemon=True)

    def __enter__(self) -> MemoryTrimmer:
        if self._trim is not None and os.path.exists("/proc/self/statm"):
            self.policy.due(resident_bytes(), time.monotonic())  # the size at start is the first floor
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.interval_s + 1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.trim_if_due()
            except OSError:  # /proc gone (a container being torn down): nothing to do
                return

    def trim_if_due(self) -> None:
        """One sample: when the policy says so, free the garbage cycles first (the collector runs seldom in the
        broker and the proxy, `popgate_process.collector`: a burst's objects caught in a cycle would otherwise keep
        their memory until it does), then give what is free back to the system —
        tests/unit/process/test_memory.py::test_a_trim_frees_garbage_cycles_first."""
        assert self._trim is not None
        before = resident_bytes()
        if not self.policy.due(before, time.monotonic()):
            return
        gc.collect()
        self._trim(0)
        after = resident_bytes()
        self.policy.trimmed(before, after, time.monotonic())
        log.info("returned %d MiB of freed memory to the system", max(0, before - after) >> 20)
