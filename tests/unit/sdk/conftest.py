"""The SDK's unit tests."""

from __future__ import annotations

import pytest

from popgate import _base, _served


@pytest.fixture(autouse=True)
def verdicts_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verdict a test sets (`consumer._batch_receive = False`: the fake serves v2 alone) holds for the test's
    length, however slow the machine: the clock verdicts expire by stands still unless a test moves it."""
    monkeypatch.setattr(_served, "clock", lambda: 0.0)


@pytest.fixture(autouse=True)
def give_backs_one_by_one(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The give-back tests' fakes are proxies without ChangeInvisibleMany: a give-back goes one message at a time, as
    to such a proxy (the window, the second's bound, close's interleavings); a test of the undelivered give-back
    (`_undelivered_requests`) is marked `undelivered`."""
    if request.node.get_closest_marker("undelivered") is None:
        monkeypatch.setattr(_base.ConsumerBase, "_gives_back_undelivered", lambda self: False)
