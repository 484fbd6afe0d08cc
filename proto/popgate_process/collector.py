"""CPython's cyclic garbage collector in the broker and the proxy: run less often than its default.

Almost everything a server process frees goes at once, by reference counting; the cyclic collector is there for
the rare cycle. Its default runs a young collection every 700 container objects allocated and not yet freed, and
in a server that is mostly the state that grows under load (deliveries in flight, cached payloads, queued answers), so
collections come in proportion to the load, each going over what grew, and every tenth young collection over the
middle generation too. At `YOUNG_THRESHOLD` the collector runs a small fraction as often; a garbage cycle waits
longer for it, until that many container objects were made after it; the memory trimmer collects before it gives
memory back after a burst (popgate_process.memory), so a cycle never keeps a burst's memory from it.

`gc.freeze()` first moves what start-up made (modules, classes, settings) to the permanent generation: a full
collection no longer goes over it. docs/BENCHMARKS.md ("What bounds the figures") has what it measured —
tests/unit/process/test_collector.py::test_the_young_threshold_is_raised_the_older_ones_kept_and_start_up_frozen,
::test_a_garbage_cycle_is_still_collected_once_that_many_objects_were_made.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 10_000


def collect_less_often(young: int = YOUNG_THRESHOLD) -> None:
    """Freeze what exists now and raise the young generation's threshold (the older ones' are kept) —
    tests/unit/process/test_collector.py."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young, middle, old)
