"""A broker's Pop answer with more messages than the Pop asked for (`max_messages`, the receive's `batch`) is cut to
that many before it reaches the client (our SDK refuses a longer answer whole); the messages past it are ready again
at their broker at once (ChangeInvisibleTime 0), but for copies of a delivery the client got, which stays the
client's. Only the answer's length is checked on the way (`Proxy.receive`): nothing per message unless it is cut —
tests/unit/proxy/test_broker_answers.py::test_a_pop_answer_past_the_pops_max_is_cut_to_it_and_the_rest_given_back.
"""

from __future__ import annotations

import asyncio
import logging

from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.receive.seam import ReceiveRequest, ReceiveResult
from proxy.routing import BrokerPool

log = logging.getLogger(__name__)


class PopCuts:
    def __init__(self, pool: BrokerPool, *, timeout_s: float) -> None:
        self._pool = pool
        self._timeout_s = timeout_s
        self.answers = 0  # answers cut so far: logged the 1st, 10th, 100th ... time
        self._giving_back: set[asyncio.Task[None]] = set()

    def cut(self, request: ReceiveRequest, result: ReceiveResult) -> None:
        """`result` (longer than `request.batch`) cut to the batch; what was cut off given back in the background."""
        excess = result.messages[request.batch :]
        del result.messages[request.batch :]
        kept = {m.receipt_handle for m in result.messages}
        back = {m.receipt_handle: m.stored.message.topic for m in excess if m.receipt_handle not in kept}
        self.answers += 1
        if str(self.answers).rstrip("0") == "1":
            log.warning(
                "broker %s answered a Pop of at most %d message(s) (group %s) with %d: cut, %d given back "
                "(%d such answers so far)",
                self._broker_of(excess[0].receipt_handle),
                request.batch,
                request.group,
                request.batch + len(excess),
                len(back),
                self.answers,
            )
        if back:
            task = asyncio.get_running_loop().create_task(self._give_back(request.group, back))
            self._giving_back.add(task)
            task.add_done_callback(self._giving_back.discard)

    async def given_back(self) -> None:
        """Wait for the give-backs under way."""
        await asyncio.gather(*self._giving_back)

    async def _give_back(self, group: str, handles: dict[str, str]) -> None:
        async def one(handle: str, topic: str) -> None:
            request = bpb.ChangeInvisibleTimeRequest(topic=topic, group=group, receipt_handle=handle, invisible_ms=0)
            await self._pool.for_handle(handle).change_invisible_time(request, timeout_s=self._timeout_s)

        for failed in await asyncio.gather(*(one(h, t) for h, t in handles.items()), return_exceptions=True):
            if isinstance(failed, errors.DomainError):  # visible again at the end of its invisible time instead
                log.debug("giving back a message past its Pop's max failed: %s", failed.message)
            elif isinstance(failed, BaseException):
                raise failed

    def _broker_of(self, handle: str) -> str:
        try:
            return self._pool.for_handle(handle).name
        except errors.DomainError:
            return "(unknown)"
