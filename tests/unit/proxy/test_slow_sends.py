"""Brokers whose sends time out in a row while their health checks pass: sent to last, probed, taken back
(`proxy.routing.SlowSends`, `proxy.sending.Sender._with_failover`)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.core import Proxy
from proxy.outgoing import Chunk
from proxy.receive.coupled import LongPollStrategy
from proxy.routing import BrokerPool, SlowSends
from tests.unit.proxy.fakes import FakeBroker


class Silent(FakeBroker):
    """Passes its health checks but answers no send while `silent`: each times out at its call's time (a store
    commit or Session handler stuck behind a stalled disk)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.silent = True
        self.tried = 0

    async def send(self, chunk: Chunk, *, timeout_s: float) -> Sequence[bpb.SendResult]:
        self.tried += 1
        if not self.silent:
            return await super().send(chunk, timeout_s=timeout_s)
        await asyncio.sleep(timeout_s)
        raise errors.BrokerTimeout(f"broker {self.name} did not answer in time")


def msg(i: int, group: str = "") -> bpb.Message:
    return bpb.Message(topic="t", message_id=f"m{i}", body=b"x", message_group=group)


def make() -> tuple[Proxy, Silent, FakeBroker, list[float]]:
    b1, b2 = Silent("b1"), FakeBroker("b2")
    pool = BrokerPool({"b1": b1, "b2": b2}, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), broker_timeout_s=0.05)
    now = [0.0]
    proxy.sender.slow = SlowSends(after=3, last_s=5.0, max_last_s=60.0, clock=lambda: now[0])
    return proxy, b1, b2, now


async def sends(proxy: Proxy, count: int, *, start: int = 0, group: str = "") -> int:
    """`count` sends one after another; how many timed out (each an error of its own: none failed over)."""
    timed_out = 0
    for i in range(start, start + count):
        try:
            await proxy.send([msg(i, group)])
        except errors.BrokerTimeout:
            timed_out += 1
    return timed_out


async def test_a_broker_whose_sends_time_out_in_a_row_is_sent_to_last_then_probed_then_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With b1 passing its health checks but answering no send, b2's sends no longer wait on b1's turn: past 3
    timeouts in a row b1 is tried last. One send probes it 5 s later, then at doubling intervals; once it answers,
    b1 is back in the rotation. Each timed-out send stays the client's PROXY_TIMEOUT (it may have been stored),
    never failed over."""
    proxy, b1, b2, now = make()
    caplog.set_level(logging.INFO, logger="proxy.sending")
    assert await sends(proxy, 6) == 3  # round robin: b1's three turns time out
    assert b1.tried == 3 and len(b2.sent) == 3
    assert await sends(proxy, 20, start=6) == 0  # then b2 takes every send, none waiting on b1
    assert b1.tried == 3 and len(b2.sent) == 23
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "broker b1" in warnings[0]

    now[0] += 5.0  # its time last is over: the next send probes it, and it still does not answer
    assert await sends(proxy, 5, start=26) == 1
    assert b1.tried == 4 and len(b2.sent) == 27  # one probe, then last again for 5 s (no second warning)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1

    b1.silent = False
    now[0] += 5.0
    assert await sends(proxy, 2, start=31) == 0 and len(b2.sent) == 29  # the next probe comes 10 s after that one
    now[0] += 5.0  # which is answered: back in the rotation
    assert await sends(proxy, 6, start=33) == 0
    assert len(b1.sent) == 4 and len(b2.sent) == 31  # the probe, then every other send
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "broker b1" in infos[0]


async def test_a_message_group_keeps_its_broker_while_that_broker_is_sent_to_last() -> None:
    """A FIFO group's order needs its one broker: its sends still go to b1 (and time out there), not to b2."""
    proxy, b1, b2, _ = make()
    group = next(f"g{i}" for i in range(100) if proxy.pool.candidates(f"g{i}")[0].name == "b1")
    await sends(proxy, 6)
    assert proxy.sender.slow.last == {"b1"}
    assert await sends(proxy, 2, start=6, group=group) == 2
    assert b1.tried == 5 and not [m for m in b2.sent if m.message_group]


async def test_a_broker_back_up_after_being_down_is_in_the_send_rotation_again() -> None:
    """A restart (the health checks see it down, then up) ends its time last: its sends are not left to a probe."""
    proxy, b1, b2, _ = make()
    await sends(proxy, 6)
    b1.silent, b1.healthy = False, False
    b1.healthy = True
    proxy.broker_up(b1)
    assert not proxy.sender.slow.last
    assert await sends(proxy, 4, start=6) == 0 and len(b1.sent) == 2


def test_slow_sends_counts_timeouts_in_a_row_and_probes_at_doubling_intervals() -> None:
    now = [100.0]
    slow = SlowSends(after=3, last_s=5.0, max_last_s=20.0, clock=lambda: now[0])
    assert [slow.timed_out("b1"), slow.timed_out("b1")] == [False, False]
    assert slow.answered("b1", slow.generation) is False and not slow.last  # an answer ends the row before it was last
    assert [slow.timed_out("b1") for _ in range(4)] == [False, False, True, False]  # put last once
    assert slow.last == {"b1"} and slow.probe() is None
    probes = []
    for _ in range(12):
        now[0] += 5.0
        probes.append(slow.probe())
    assert probes == ["b1", None, "b1", None, None, None, "b1", None, None, None, "b1", None]  # 5, 10, 20, 20 s
    assert slow.last == {"b1"}
    assert slow.answered("b1", slow.generation) is True and not slow.last and slow.probe() is None
    assert slow.answered("b1", slow.generation) is False
    assert [slow.timed_out("b1") for _ in range(3)] == [False, False, True]
    assert slow.forget("b1") is True and not slow.last and slow.forget("b1") is False
    assert [slow.timed_out("b1") for _ in range(2)] == [False, False] and not slow.last  # a new row


def test_brokers_sent_to_last_leave_the_rotation_to_the_others() -> None:
    """The others share the sends evenly (not the slow broker's turns all going to its successor); when every live
    broker is slow they rotate as before."""
    pool = BrokerPool({n: FakeBroker(n) for n in ("b1", "b2", "b3")}, first_turn=0)
    orders = [[c.name for c in pool.candidates(last={"b1"})] for _ in range(6)]
    assert Counter(o[0] for o in orders) == {"b2": 3, "b3": 3} and all(o[2] == "b1" for o in orders)
    firsts = Counter(pool.candidates(last={"b1", "b2", "b3"})[0].name for _ in range(6))
    assert firsts == {"b1": 2, "b2": 2, "b3": 2}


def test_sends_started_before_a_broker_was_put_last_do_not_take_it_back() -> None:
    """A broker at the edge of its capacity: sends that were on their way as it was put last are stored after, and
    say nothing of it now; a send started since (the probe) does."""
    slow = SlowSends(after=3, last_s=5.0, clock=lambda: 0.0)
    before = slow.generation
    assert [slow.timed_out("b1") for _ in range(3)] == [False, False, True]
    assert slow.answered("b1", before) is False and slow.last == {"b1"}
    assert slow.answered("b1", slow.generation) is True and not slow.last


async def test_a_timeout_cut_short_by_a_clients_deadline_is_not_the_brokers() -> None:
    """A client with little time left (the proxy cuts the broker call to its deadline): the broker timing out then
    is not counted against it, so one impatient client does not send every client's sends elsewhere."""
    b1, b2 = Silent("b1"), FakeBroker("b2")
    pool = BrokerPool({"b1": b1, "b2": b2}, first_turn=0)
    proxy = Proxy(pool, LongPollStrategy(pool, broker_timeout_s=1.0), broker_timeout_s=3.0)
    loop = asyncio.get_running_loop()
    timed_out = 0
    for i in range(8):
        try:
            await proxy.send([msg(i)], deadline=loop.time() + 0.2)  # the broker call cut to ~0.1 s
        except errors.BrokerTimeout:
            timed_out += 1
    assert timed_out == 4 and not proxy.sender.slow.last  # b1's turns timed out; b1 is not put last
