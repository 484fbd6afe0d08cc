"""When a receive on the Session stream asks again (`sdk/_again.py`), with the clock given."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from popgate._again import Again


def doubling() -> Iterator[float]:
    return (0.05 * 2**i for i in itertools.count())


def test_a_receive_cut_short_asks_the_rest_of_its_wait_then_once_more_when_none_is_left() -> None:
    again = Again(5.0, 100.0, doubling)
    assert again.cut_short(102.0)
    assert again.asking(102.0) == 3.0
    assert not again.cut_short(105.5)  # over, asked again already: answers empty
    late = Again(1.0, 100.0, doubling)
    assert late.cut_short(101.5)  # its first answer came past its wait: asks once more, not waiting
    assert late.asking(101.5) == 0.0


def test_a_stream_that_served_its_ask_a_while_is_asked_again_at_once_for_the_rest() -> None:
    again = Again(12.0, 0.0, doubling)
    for end in (0.8, 1.6, 2.4, 3.2):  # a connection aging every 0.8 s
        assert again.ended(end) == 0.0
        assert again.asking(end) == 12.0 - end


def test_streams_ending_at_once_back_off_growing_within_the_wait() -> None:
    again = Again(1.0, 0.0, doubling)
    now, delays = 0.0, []
    while (delay := again.ended(now + 0.001)) is not None:
        delays.append(delay)
        now += 0.001 + delay
        again.asking(now)
    assert delays[:4] == [0.05, 0.1, 0.2, 0.4]
    assert sum(delays) <= 1.0 and len(delays) <= 8


def test_an_end_past_the_wait_asks_once_more_not_waiting_then_is_an_attempt() -> None:
    again = Again(1.0, 0.0, doubling)
    again.asking(0.5)
    assert again.ended(1.02) == 0.0  # the ask that ended waited: one more, for what is ready
    assert again.asking(1.02) == 0.0
    assert again.ended(1.03) is None  # that one asked no wait: the receive fails (retriable)


def test_only_streams_ending_as_soon_as_asked_spend_a_wait() -> None:
    """A receive not waiting whose one stream ended, or one whose stream served its whole wait and whose last ask
    ended too, fails as any attempt (retried); one whose streams ended as soon as asked, backing off, spends its
    wait (`backed_off`: not asked again)."""
    once = Again(0.0, 0.0, doubling)
    assert once.ended(0.001) is None and not once.backed_off
    served = Again(0.2, 0.0, doubling)
    assert served.ended(0.21) == 0.0  # the stream served its whole wait
    served.asking(0.21)
    assert served.ended(0.211) is None and not served.backed_off
    quick = Again(0.2, 0.0, doubling)
    now = 0.0
    while (delay := quick.ended(now + 0.001)) is not None:
        now += 0.001 + delay
        quick.asking(now)
    assert quick.backed_off
    recovered = Again(5.0, 0.0, doubling)
    assert recovered.ended(0.001) == 0.05 and recovered.backed_off  # an end at once, then a stream that served
    recovered.asking(0.05)
    assert recovered.ended(5.0) == 0.0 and not recovered.backed_off
    recovered.asking(5.0)
    assert recovered.ended(5.001) is None and not recovered.backed_off  # an attempt, retried
