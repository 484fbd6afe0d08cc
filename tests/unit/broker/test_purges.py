"""broker.purges.PurgeCounts without a store: a cut holds only while its topic was not purged since its deletion's
first step, and nothing is counted while no deletion runs."""

from __future__ import annotations

from broker.purges import PurgeCounts


def test_a_topic_purged_after_a_deletions_first_step_loses_its_cut_and_nothing_stays() -> None:
    purges = PurgeCounts()
    purges.purged("gone")  # no deletion running: not kept
    assert purges.counts == {}
    first: dict[str, int] = {}
    assert purges.cuts_holding(first, [("a", 0, 5), ("b", 0, 5)]) == [("a", 0, 5), ("b", 0, 5)]
    purges.step_done(first, more=True)
    purges.purged("b")  # deleted (and maybe made again) while the deletion runs
    assert purges.cuts_holding(first, [("a", 0, 9), ("b", 0, 9)]) == [("a", 0, 9)]
    later: dict[str, int] = {}  # a deletion that starts after the purge takes the count as it is
    assert purges.cuts_holding(later, [("b", 1, 3)]) == [("b", 1, 3)]
    purges.step_done(later, more=False)
    assert purges.counts == {"b": 1}  # the first is still running
    purges.step_done(first, more=False)
    assert purges.counts == {}
