import pytest

from broker.filters import MATCH_ALL, TagFilter
from popgate_contract.errors import IllegalFilter


def test_star_and_empty_match_everything() -> None:
    assert TagFilter.parse("*") is MATCH_ALL
    assert TagFilter.parse("  ") is MATCH_ALL
    assert MATCH_ALL.matches(None) and MATCH_ALL.matches("x")


def test_tag_alternatives() -> None:
    f = TagFilter.parse(" a || b ||c ")
    assert f.tags == frozenset({"a", "b", "c"})
    assert f.matches("b") and not f.matches("d") and not f.matches(None)
    assert str(f) == "a||b||c"
    assert TagFilter.parse(str(f)) == f


@pytest.mark.parametrize("text", ["a || * ", "a | b", "a||\x00", "x" * 2000, "||", " || ", "|| ||"])
def test_bad_expressions(text: str) -> None:
    with pytest.raises(IllegalFilter):
        TagFilter.parse(text)


@pytest.mark.parametrize(
    ("text", "tags"), [("a ||", {"a"}), ("|| a", {"a"}), ("a||||b", {"a", "b"}), ("a || || b", {"a", "b"})]
)
def test_empty_parts_are_skipped_as_rocketmqs_filter_api_skips_them(text: str, tags: set[str]) -> None:
    """An expression with only empty parts is refused (test_bad_expressions): it would select no message."""
    assert TagFilter.parse(text).tags == frozenset(tags)


def test_the_stored_form_is_never_longer_than_the_expression_accepted() -> None:
    # 256 two-letter tags, written compactly: 1,022 characters, under the limit. The stored form used to put
    # " || " between tags (1,532 characters), which the limit then refused when the broker read it back at start.
    tags = [a + b for a in "abcdefghijklmnopqrstuvwxyz" for b in "abcdefghijklmnopqrstuvwxyz"][:256]
    expression = "||".join(tags)
    assert len(expression) == 1022
    stored = str(TagFilter.parse(expression))
    assert len(stored) <= len(expression)
    assert TagFilter.parse(stored) == TagFilter.parse(expression)


def test_a_stored_filter_is_read_back_without_the_length_limit() -> None:
    long = " || ".join(f"t{i:03}" for i in range(300))  # as older versions stored it: over 1,024 characters
    with pytest.raises(IllegalFilter):
        TagFilter.parse(long)
    assert TagFilter.parse(long, max_len=None).tags == frozenset(f"t{i:03}" for i in range(300))
