"""Every live broker learns of a consumer group from the group's first receive of a topic through this proxy.

A broker keeps a group's state on a topic (where it starts, what it has acked, so its lag) from the
group's first Pop or Notification there, and a receive answered by its first Pop asks one broker only.
So the first receive of (topic, group) on a proxy also sends a Notification with poll 0 to every live
broker: it consumes nothing and is answered at once, and the broker fixes the group's start there. A
group's backlog on any live broker then counts in every lag figure (broker /metrics, `popgate stats`, the
Spark job), and under `latest` its start on each broker is the moment the group came, not the moment a
receive first reached that broker — tests/unit/proxy/receive/test_notify_driver.py::
test_a_groups_first_receive_announces_it_to_every_live_broker_once.

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
