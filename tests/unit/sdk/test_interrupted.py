"""Ctrl-C in `popgate send` and `popgate receive`: the summary counts what is known done, and says how many were in a
call cut short, whose outcome is not known (stored or not; acked, or back after the invisible time)."""

from __future__ import annotations

from typing import Any

import pytest

from popgate import Message
from popgate.cli import commands, sending
from popgate.cli.main import main


class CutShort:
    """A Producer or a SimpleConsumer whose second send or ack is cut short by Ctrl-C."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.calls = 0

    def __enter__(self) -> CutShort:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass

    def _call(self) -> None:
        self.calls += 1
        if self.calls == 2:
            raise KeyboardInterrupt

    def send_many(self, topic: str, bodies: list[bytes], **options: Any) -> list[Any]:
        self._call()
        return []

    def receive(self, *, max: int, wait: float) -> list[Message]:
        return [Message(b"m") for _ in range(max)]

    def ack_many(self, messages: list[Message]) -> None:
        self._call()


@pytest.fixture(autouse=True)
def nothing_listening_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (sending, commands):
        monkeypatch.setattr(module, "check_listening", lambda endpoint: None)


def test_send_counts_a_send_cut_short_by_ctrl_c_as_unknown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sending, "Producer", CutShort)
    assert main(["send", "t", "x", "-n", "10", "-b", "4"]) == 130
    summary = capsys.readouterr().err
    assert "sent 4 messages" in summary and "4 messages more in a send cut short: stored, or not" in summary


def test_receive_counts_an_ack_cut_short_by_ctrl_c_as_unknown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(commands, "SimpleConsumer", CutShort)
    assert main(["receive", "t", "-g", "g", "-n", "10", "-b", "4"]) == 130
    summary = capsys.readouterr().err.splitlines()[-1]
    assert "received 8 messages (4 acked, 4 in an ack cut short: acked, or back later)" in summary
