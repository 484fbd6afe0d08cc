"""Which consumer groups and (topic, group) pairs have metric labels of their own on this proxy. Any client can name
a new group or topic per request, and every label set is kept for the process's life, so the first `max_groups`
groups and `max_pairs` pairs a broker served a request of are named and the others share OTHER_GROUPS; a request a
broker refused (a missing topic's receive, a garbage handle's ack) names nothing —
tests/unit/proxy/test_delivery_metrics.py::test_refused_receives_and_acks_take_no_label_from_a_group_a_broker_serves.
"""

from __future__ import annotations

MAX_GROUP_LABELS = 1000  # consumer groups with their own label on this proxy; the others share OTHER_GROUPS
MAX_TOPIC_GROUP_LABELS = 1000  # (topic, group) pairs with their own labels; the others' topic is OTHER_GROUPS
OTHER_GROUPS = "_other"
SERVED = frozenset({"messages", "empty"})  # the receive outcomes a broker served

Decision = tuple[str, str]  # an adaptive receive's (mode, reason)


class GroupLabels:
    def __init__(self, max_groups: int = MAX_GROUP_LABELS, max_pairs: int = MAX_TOPIC_GROUP_LABELS) -> None:
        self.named: set[str] = set()  # the groups with a label of their own
        self._max_groups = max_groups
        self._pairs: set[tuple[str, str]] = set()
        self._max_pairs = max_pairs
        # Mode decisions of receives still in progress of groups without a label yet, by the id of each receive's
        # request (alive until its end), counted once they end
        self._pending: dict[str, dict[int, Decision]] = {}

    def group(self, group: str, served: bool, request: object = None) -> tuple[str, list[Decision]]:
        """A group without a label yet: its label (its name if `served` and there is room), and the decisions to
        count under it now: once named, every kept one (the receives still waiting will end under its name); else
        only that of the receive of `request` ending — tests/unit/proxy/test_delivery_metrics.py::
        test_each_receive_counts_its_own_mode_decision_under_the_label_its_outcome_gives."""
        named = group in self.named or (served and len(self.named) < self._max_groups)
        if named:
            self.named.add(group)
        pending = self._pending.get(group)
        if pending is None:
            return (group if named else OTHER_GROUPS), []
        if named:
            del self._pending[group]
            return group, list(pending.values())
        decision = pending.pop(id(request), None) if request is not None else None
        if not pending:
            del self._pending[group]
        return OTHER_GROUPS, [decision] if decision is not None else []

    def pair(self, topic: str, label: str, served: bool) -> tuple[str, str]:
        """Labels of a (topic, group) pair, given the group's label."""
        pair = (topic, label)
        if pair in self._pairs:
            return pair
        if served and len(self._pairs) < self._max_pairs:
            self._pairs.add(pair)
            return pair
        return OTHER_GROUPS, label

    def defer(self, group: str, request: object, decision: Decision) -> bool:
        """Keep the decision of the receive of `request`, made before it was served, until it ends (`group` with
        the same request); False when it is to be counted now (the group has a label, or too many groups wait)."""
        if group in self.named or (group not in self._pending and len(self._pending) >= self._max_groups):
            return False
        self._pending.setdefault(group, {})[id(request)] = decision
        return True
