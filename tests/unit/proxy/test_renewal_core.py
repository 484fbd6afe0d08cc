"""The renewal driver against a real BrokerCore (its `renew`, behind a proxy-side client that can fail calls): a
broker briefly away does not cost the messages, and a broker with a small send batch still takes whole renewals.
Clock: the loop's, with short invisible times."""

from __future__ import annotations

import asyncio
from pathlib import Path

from popgate_pb import broker_pb2 as pb

from broker.core import BrokerCore
from popgate_contract import errors
from popgate_contract.errors import DomainError
from proxy.renewal import Renewer
from proxy.renewal_book import RenewalLimits, renewal_period_s
from proxy.routing import BrokerPool
from tests.unit.broker.cores import broker
from tests.unit.proxy.fakes import FakeBroker


class CoreClient(FakeBroker):
    """A proxy-side broker client whose `renew` is the core's; its first `fail` calls fail (broker away)."""

    def __init__(self, core: BrokerCore, fail: int = 0) -> None:
        super().__init__("b1")
        self.core = core
        self.fail_left = fail
        self.outcomes: list[str] = []

    async def renew(self, request: pb.RenewRequest, *, timeout_s: float) -> pb.RenewResponse:
        if self.fail_left:
            self.fail_left -= 1
            self.outcomes.append("failed")
            raise errors.BrokerUnavailable("briefly away")
        try:
            results, until = await self.core.renew(request.group, list(request.receipt_handles), request.invisible_ms)
        except DomainError as exc:
            self.outcomes.append(exc.name)
            raise
        out = pb.RenewResponse(invisible_until_ms=until)
        for handle, error in zip(request.receipt_handles, results, strict=True):
            out.results.add(receipt_handle=handle, ok=error is None, error="" if error is None else error.name)
        self.outcomes.append("ok" if not any(results) else "stale")
        return out


async def renewed_for(core: BrokerCore, client: CoreClient, handles: list[str], invisible_ms: int) -> None:
    """Track `handles` for a live client and let renewal run 1.6 invisible times."""
    limits = RenewalLimits(period_s=renewal_period_s(invisible_ms / 1000))
    async with Renewer(BrokerPool({"b1": client}), limits, invisible_ms=invisible_ms) as renewer:
        renewer.opened("c1")
        renewer.track("c1", "g", handles)
        await asyncio.sleep(invisible_ms / 1000 * 1.6)


async def test_two_failed_renewals_in_a_row_still_keep_the_message_invisible(tmp_path: Path) -> None:
    async with broker(tmp_path, queues_per_topic=1) as (core, _):
        await core.send([pb.Message(topic="t", body=b"x")])
        [popped] = (await core.pop("t", "g", "*", 1, 3000, 0)).messages
        client = CoreClient(core, fail=2)
        await renewed_for(core, client, [popped.handle], 3000)
        outcomes, again = client.outcomes, (await core.pop("t", "g", "*", 1, 3000, 0)).messages
    assert outcomes[:3] == ["failed", "failed", "ok"], outcomes
    assert again == [], f"redelivered after {outcomes}"
