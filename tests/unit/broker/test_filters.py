import pytest

from broker.errors import IllegalFilter
from broker.filters import MATCH_ALL, TagFilter


def test_star_and_empty_match_everything() -> None:
    assert TagFilter.parse("*") is MATCH_ALL
    assert TagFilter.parse("  ") is MATCH_ALL
    assert MATCH_ALL.matches(None) and MATCH_ALL.matches("x")


def test_tag_alternatives() -> None:
    f = TagFilter.parse(" a || b ||c ")
    assert f.tags == frozenset({"a", "b", "c"})
    assert f.matches("b") and not f.matches("d") and not f.matches(None)
    assert str(f) == "a || b || c"
    assert TagFilter.parse(str(f)) == f


@pytest.mark.parametrize("text", ["a ||", "|| a", "a || * ", "a | b", "a||\x00", "x" * 2000])
def test_bad_expressions(text: str) -> None:
    with pytest.raises(IllegalFilter):
        TagFilter.parse(text)
