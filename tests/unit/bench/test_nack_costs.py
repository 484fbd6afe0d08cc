"""bench.nack_costs: each kind runs first in some pair, a round nacks first deliveries only, and each ratio is
against the same pair's base round."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from bench import nack_costs
from bench.nack_costs import Result, Settle, figures


@dataclass
class Delivery:
    message_id: str
    attempt: int


@dataclass
class FakeConsumer:
    """Answers one receive with `messages`; records what was nacked (each call's ids) and acked."""

    messages: list[Delivery]
    nacks: list[list[str]] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)

    async def receive(self, max: int, invisible: float, wait: float) -> list[Delivery]:
        return self.messages

    async def nack(self, message: Delivery, delay: float) -> Delivery:
        assert delay == 0
        self.nacks.append([message.message_id])
        return message

    async def nack_many(self, messages: list[Delivery], delay: float) -> list[Delivery]:
        assert delay == 0
        self.nacks.append([m.message_id for m in messages])
        return messages

    async def ack_many(self, messages: list[Delivery]) -> None:
        self.acked += [m.message_id for m in messages]


def test_each_kind_runs_first_in_one_pair_and_last_in_the_next() -> None:
    assert nack_costs.order(0) == ("base", "nack", "gathered", "many")
    assert nack_costs.order(1) == ("many", "gathered", "nack", "base")
    assert nack_costs.order(2) == nack_costs.order(0)


@pytest.mark.parametrize(
    ("kind", "nacks", "acked"),
    [
        ("base", [], ["a", "b", "c"]),
        ("nack", [["a"], ["c"]], ["b"]),
        ("gathered", [["a"], ["c"]], ["b"]),
        ("many", [["a", "c"]], ["b"]),
    ],
)
def test_first_deliveries_are_nacked_and_redeliveries_acked(
    kind: str, nacks: list[list[str]], acked: list[str]
) -> None:
    consumer: Any = FakeConsumer([Delivery("a", 1), Delivery("b", 2), Delivery("c", 1)])
    settle = Settle(consumer, nack_costs.NACKS[kind])
    assert asyncio.run(settle()) == len(acked)  # run_phase counts the acked only
    assert (consumer.nacks, consumer.acked, settle.deliveries) == (nacks, acked, 3)


def test_a_ratio_is_against_the_base_round_of_its_own_pair() -> None:
    # Pair 0 base 10 µs, many 30 (3x); pair 1, a slower host: base 20, many 40 (2x); pair 2: base 10, many 25 (2.5x).
    # Medians of the pairs' ratios: 2.5x; against the median base (10 µs) it would be 3x.
    cpu_us = {(0, "base"): 10, (0, "many"): 30, (1, "base"): 20, (1, "many"): 40, (2, "base"): 10, (2, "many"): 25}
    results = [Result(kind, pair, 1000, us / 10, us * 1e-3, 1000) for (pair, kind), us in cpu_us.items()]
    values = figures(results)
    assert values["many"]["server_cpu_us_per_msg"] == pytest.approx(30)
    assert values["many"]["ratio_to_base"] == pytest.approx(2.5)
    assert values["base"]["ratio_to_base"] == pytest.approx(1)
    assert values["many"]["msg_s"] == pytest.approx(1000 / 3.0)
