"""What a registry exports, as tests compare it, and prometheus_client's `_created` series switched on or off."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, enable_created_metrics


@contextmanager
def created_series(on: bool) -> Iterator[None]:
    """prometheus_client's `_created` series on or off (process-wide), as before afterwards."""
    was_on = any(s.name.endswith("_created") for m in Counter("probe", "", registry=None).collect() for s in m.samples)
    (enable_created_metrics if on else disable_created_metrics)()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        (enable_created_metrics if was_on else disable_created_metrics)()  # type: ignore[no-untyped-call]


def family_samples(registry: CollectorRegistry, name: str) -> list[tuple[str, dict[str, str], float | None]]:
    """The samples of the metric family `name` in scrape order; a `_created` value (a time) as None."""
    return [
        (s.name, s.labels, None if s.name.endswith("_created") else s.value)
        for family in registry.collect()
        if family.name == name
        for s in family.samples
    ]
