"""Tag filter expressions: ``*`` (or empty) matches all, else ``a || b || c``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from popgate_contract.validation import MAX_FILTER_LEN, split_tags


@dataclass(frozen=True, slots=True)
class TagFilter:
    """A parsed filter; ``tags is None`` means every message matches."""

    tags: frozenset[str] | None

    @classmethod
    def parse(cls, expression: str, *, max_len: int | None = MAX_FILTER_LEN) -> TagFilter:
        """Parse a filter a client sent (at most `max_len` characters), or, with ``max_len=None``, one the store
        kept: a stored filter was accepted once, so a later, smaller limit must not make the broker refuse to start."""
        tags = split_tags(expression, max_len=max_len)
        return MATCH_ALL if tags is None else cls(frozenset(tags))

    def matches(self, tag: str | None) -> bool:
        return self.tags is None or (tag is not None and tag in self.tags)

    def count(self, tag_counts: Mapping[str | None, int], total: int) -> int:
        """How many of a batch of messages match, given the batch's count of each tag (None: untagged) and its
        size: a lookup per tag of the smaller side, not one per message, so an arrival of many messages costs
        each held filter a few lookups — tests/unit/broker/test_longpoll.py::
        test_an_arrival_reads_its_tags_once_however_many_distinct_filters_are_held."""
        if self.tags is None:
            return total
        if len(self.tags) <= len(tag_counts):
            return sum(tag_counts.get(tag, 0) for tag in self.tags)
        return sum(n for tag, n in tag_counts.items() if tag in self.tags)

    def __str__(self) -> str:
        # The stored form. No spaces around ``||``: it is then never longer than the expression it was parsed from
        # (parts are stripped, duplicates dropped), so what was accepted fits the limit when read back.
        return "*" if self.tags is None else "||".join(sorted(self.tags))


MATCH_ALL = TagFilter(None)
