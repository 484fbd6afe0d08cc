"""bench.ratios: the direct floor counts only what the brokers stored and acked, and neither side always runs
first."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest
from popgate_pb import broker_pb2 as bpb

from bench import ratios
from bench.ratios_report import Phase, figures


class FakeSession:
    """A broker Session that answers a Send with `stored` results and an Ack with every handle `ok` or not."""

    def __init__(self, stored: int | None = None, ok: bool = True) -> None:
        self.stored, self.ok = stored, ok

    async def send(self, request: bpb.SendRequest) -> bpb.SendResponse:
        n = len(request.messages) + sum(len(run.bodies) for run in request.runs)
        count = n if self.stored is None else self.stored
        return bpb.SendResponse(results=[bpb.SendResult(message_id=f"m{i}") for i in range(count)])

    async def pop(self, request: bpb.PopRequest) -> bpb.PopResponse:
        return bpb.PopResponse(
            messages=[bpb.PoppedMessage(receipt_handle="h1"), bpb.PoppedMessage(receipt_handle="h2")]
        )

    async def ack(self, request: bpb.AckRequest) -> bpb.AckResponse:
        results = [bpb.AckResult(receipt_handle=h, ok=self.ok, error="" if self.ok else "InvalidHandle")
                   for h in request.receipt_handles]  # fmt: skip
        return bpb.AckResponse(results=results)


def once(step: ratios.Step) -> int:
    async def run() -> int:
        return await step()

    return asyncio.run(run())


def direct(session: FakeSession, runs: bool = False) -> ratios.Direct:
    args = argparse.Namespace(batch=4, size=8, direct_runs=runs)
    return ratios.Direct([session], args)  # type: ignore[list-item]


@pytest.mark.parametrize("runs", [False, True])
def test_the_direct_floor_raises_on_a_failed_send(runs: bool) -> None:
    assert once(direct(FakeSession(), runs).produce("t", ratios.Claims(4))) == 4
    with pytest.raises(RuntimeError, match="4 messages answered 3"):
        once(direct(FakeSession(stored=3), runs).produce("t", ratios.Claims(4)))


def test_the_direct_floor_raises_on_a_refused_ack() -> None:
    assert once(direct(FakeSession()).consume("t")) == 2
    with pytest.raises(RuntimeError, match="refused 2 of 2: InvalidHandle"):
        once(direct(FakeSession(ok=False)).consume("t"))


def test_each_side_runs_first_in_one_pair_and_each_ratio_is_against_its_neighbour() -> None:
    assert ratios.ROUNDS == ("direct", "sdk", "sdk", "direct")
    # Rates 1, 2 | 30, 10 by round: neighbours give ratios 2 and 3 (median 2.5); across pairs would give 0.2 or 20.
    rates: list[float] = [1.0, 2.0, 30.0, 10.0]
    rounds: list[list[Phase]] = []
    for side, rate in zip(ratios.ROUNDS, rates, strict=True):
        cpu: dict[str, Any] = {"client": 1.0, "proxy": 1.0, "b1": 1.0}
        rounds.append([Phase(side, kind, int(rate * 100), 100.0, cpu) for kind in ("produce", "consume")])
    assert figures(rounds, ["b1"])["produce_msg_s_sdk_direct_ratio"] == pytest.approx(2.5)
