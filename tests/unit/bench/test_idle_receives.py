"""bench.idle_receives: figures per receive only when every receive asked for is still held after the hold."""

from __future__ import annotations

import pytest

from bench import idle_receives


def test_every_receive_held_gives_figures() -> None:
    assert idle_receives.unheld(1000, still=1000, proxy_ended=0, floor_ended=0) == ""
    assert idle_receives.unheld(1000, still=4000, proxy_ended=0, floor_ended=0) == ""  # notify: one per broker


@pytest.mark.parametrize(
    ("still", "proxy_ended", "floor_ended", "reason"),
    [
        (262, 738, 0, "738 of 1000 receives ended before the hold did"),  # refused: TOO_MANY_REQUESTS
        (0, 0, 0, "the brokers held 0 requests after the hold"),  # expired during the hold
        (1000, 0, 5, "the bare server did not hold 5 of its 1000 calls"),
    ],
)
def test_receives_not_held_give_no_figures(still: int, proxy_ended: int, floor_ended: int, reason: str) -> None:
    assert reason in idle_receives.unheld(1000, still=still, proxy_ended=proxy_ended, floor_ended=floor_ended)


@pytest.mark.parametrize("hold_s", [10.0, 20.0, 33.0, 120.0])
def test_the_long_poll_outlasts_opening_and_the_hold(hold_s: float) -> None:
    wait = idle_receives.long_poll_s(hold_s)
    assert wait > idle_receives.OPEN_S + idle_receives.SETTLE_S + hold_s + 30  # + py-spy's wait
    assert idle_receives.request("idle", "g-idle", wait).long_polling_timeout.seconds >= int(wait)
