"""The SDK's unit tests."""

from __future__ import annotations

import pytest

from popgate import _served


@pytest.fixture(autouse=True)
def verdicts_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A verdict a test sets (`consumer._batch_receive = False`: the fake serves v2 alone) holds for the test's
    length, however slow the machine: the clock verdicts expire by stands still unless a test moves it."""
    monkeypatch.setattr(_served, "clock", lambda: 0.0)
