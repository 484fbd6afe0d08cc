"""bench.ratios: the direct floor counts only what the brokers stored and acked."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from popgate_pb import broker_pb2 as bpb

from bench import ratios


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
