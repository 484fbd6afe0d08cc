"""Which retention cuts still hold while a deletion runs in steps: a topic deleted (and maybe sent to again, its
offsets from 0) after a deletion's first step must not get the cut meant for the old topic. Pure; the store's
writer thread uses it under its lock (broker/sqlite_store.py)."""

from __future__ import annotations

from broker.store_writes import Cut


class PurgeCounts:
    """PurgeTopic ops applied per topic while some deletion is past its first step and not finished. Only such a
    deletion's later steps compare counts, so none is kept while none is in progress — tests/unit/broker/
    test_admin.py::test_deleted_topics_leave_nothing_behind_however_many and test_retention.py::
    test_a_topic_deleted_during_a_deletion_keeps_its_new_messages."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._running: set[int] = set()  # the deletions in progress (the ids of their `purged` snapshots)

    def purged(self, topic: str) -> None:
        """A PurgeTopic of `topic` was applied."""
        if self._running:
            self.counts[topic] = self.counts.get(topic, 0) + 1
        else:  # a deletion to come takes each topic's count at its first step, whatever it is then
            self.counts.clear()

    def cuts_holding(self, snapshot: dict[str, int], cuts: list[Cut]) -> list[Cut]:
        """The `cuts` of a deletion step whose topic was not purged since the deletion's first step; `snapshot`
        (the deletion's own, shared by its steps) takes each topic's count at its first step."""
        for topic, _, _ in cuts:
            snapshot.setdefault(topic, self.counts.get(topic, 0))
        return [cut for cut in cuts if self.counts.get(cut[0], 0) == snapshot[cut[0]]]

    def step_done(self, snapshot: dict[str, int], *, more: bool) -> None:
        """A deletion's step ended; `more`: the deletion has steps left (else it is done or failed)."""
        if more:
            self._running.add(id(snapshot))
            return
        self._running.discard(id(snapshot))
        if not self._running:
            self.counts.clear()
