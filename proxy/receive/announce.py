"""Every live broker learns of a consumer group from the group's first receive of a topic through this proxy.

A broker keeps a group's state on a topic (where it starts, what it has acked, so its lag) from the
group's first Pop or Notification there. A receive answered by its first Pop asks one broker only, so
without this a group with a backlog on another broker had no state there, and its messages there were
missing from every lag figure (broker /metrics, `popgate stats`, the Spark job); under `latest` the
group's start on that broker was the moment a receive first reached it, not the moment the group came.
So the first receive of (topic, group) on a proxy also sends a Notification with poll 0 to every live
broker: it consumes nothing and is answered at once, and the broker fixes the group's start there.

Per proxy and bounded (the most recent `capacity` pairs): a proxy restarted, or a pair forgotten, only
announces again, which changes nothing at a broker that knows the group.
"""

from __future__ import annotations

from collections import OrderedDict


class GroupsSeen:
    """The (topic, group) pairs this proxy has announced, the most recent `capacity` of them. Pure."""

    def __init__(self, capacity: int = 100_000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity {capacity!r} must be >= 1")
        self._capacity = capacity
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def first_sight(self, topic: str, group: str) -> bool:
        """True the first time (topic, group) comes, or again once it was forgotten."""
        key = (topic, group)
        if key in self._seen:
            self._seen.move_to_end(key)
            return False
        self._seen[key] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return True

    def __len__(self) -> int:
        return len(self._seen)
