"""Memory bounds of a real broker process: bytes of Sends in flight (`--max-send-bytes`) and bytes of unary Pop
answers its callers have not taken (`--max-pop-answer-bytes`). Over either: TooManyRequests, nothing stored or
popped half-way, and the broker goes on serving (docs/BROKER.md, "Errors and limits")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from popgate_pb import broker_pb2 as pb

from tests.conftest import BrokerHandle
from tests.procs import wait_until

MiB = 1024 * 1024


def outcome(future: grpc.Future) -> str:
    try:
        future.result(timeout=60)
    except grpc.RpcError as exc:
        name = dict(exc.trailing_metadata() or ()).get("popgate-error", "")  # type: ignore[attr-defined]
        return f"{exc.code().name}/{name}"  # type: ignore[attr-defined]
    return "OK"


def stored(broker: BrokerHandle, topic: str) -> int:
    queues = broker.stub.Stats(pb.StatsRequest(topic=topic), timeout=10).queues
    return sum(q.max_offset - q.min_offset for q in queues)


def test_sends_beyond_max_send_bytes_are_too_many_requests_and_store_nothing(make_broker: object) -> None:
    """With room for one 3 MiB Send at a time, 32 sent at once: those arriving while another's commit is under
    way are refused whole; the others are stored whole; the budget comes back when the commits settle."""
    broker: BrokerHandle = make_broker("b1", "--max-send-bytes", str(4 * MiB), "--flush", "sync")  # type: ignore[operator]
    body = os.urandom(MiB)
    request = pb.SendRequest(messages=[pb.Message(topic="bounded", body=body) for _ in range(3)])
    futures = [broker.stub.Send.future(request, timeout=60) for _ in range(32)]
    outcomes = Counter(outcome(f) for f in futures)
    assert set(outcomes) == {"OK", "RESOURCE_EXHAUSTED/TooManyRequests"}, outcomes
    assert stored(broker, "bounded") == 3 * outcomes["OK"]  # a refused Send stored none of its messages
    # Every commit settled: the whole budget is back (a Send is refused only while another holds some of it).
    assert len(broker.stub.Send(request, timeout=30).results) == 3
    assert len(broker.stub.Send(request, timeout=30).results) == 3
    assert stored(broker, "bounded") == 3 * outcomes["OK"] + 6


STALLED_CLIENT = """
import asyncio, sys
import grpc
from popgate_pb import broker_pb2 as pb, broker_pb2_grpc as pb_grpc

async def main() -> None:
    channel = grpc.aio.insecure_channel(sys.argv[1], options=[("grpc.max_receive_message_length", -1)])
    stub = pb_grpc.BrokerStub(channel)
    request = pb.PopRequest(topic="big", group="stalled", filter="*", max_messages=16, invisible_ms=600000,
                            poll_ms=30000)
    await asyncio.gather(*(stub.Pop(request, timeout=120) for _ in range(int(sys.argv[2]))), return_exceptions=True)

asyncio.run(main())
"""


@pytest.fixture
def stalled_client() -> Iterator[object]:
    started: list[subprocess.Popen[bytes]] = []

    def start(address: str, pops: int) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", STALLED_CLIENT, address, str(pops)])
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait(timeout=10)


def test_unary_pop_answers_a_caller_does_not_take_are_bounded(make_broker: object, stalled_client: object) -> None:
    """A client holds 4 Pops, then stops reading (SIGSTOP) before they are answered: an answer it does not take
    (16 x 500 KB) fills the 8 MiB budget; the Pops woken after it put what they took back and are refused; a new Pop
    is refused before it pops anything. Once the client is gone, Pops are answered again."""
    broker: BrokerHandle = make_broker("b1", "--max-pop-answer-bytes", str(8 * MiB))  # type: ignore[operator]
    client = stalled_client(broker.address, 4)  # type: ignore[operator]

    def held() -> int:
        return int(broker.stub.Stats(pb.StatsRequest(topic="none"), timeout=10).held_pops)

    assert wait_until(lambda: held() == 4, timeout=20)
    os.kill(client.pid, signal.SIGSTOP)
    body = os.urandom(500_000)  # 16 of them fill an answer (--max-pop-bytes 8 MiB)
    for _ in range(4):
        broker.stub.Send(pb.SendRequest(messages=[pb.Message(topic="big", body=body) for _ in range(16)]), timeout=30)

    probe = pb.PopRequest(topic="big", group="probe", filter="*", max_messages=1, invisible_ms=60000)

    def refused() -> bool:
        try:
            broker.stub.Pop(probe, timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc  # type: ignore[attr-defined]
            assert "--max-pop-answer-bytes" in (exc.details() or "")  # type: ignore[attr-defined]
            return True
        return False

    assert wait_until(refused, timeout=10)
    assert wait_until(lambda: held() == 0, timeout=10)  # every stalled Pop was woken and answered

    def probe_inflight() -> int:
        return sum(r.inflight for r in broker.stub.Stats(pb.StatsRequest(topic="big", group="probe")).groups)

    before = probe_inflight()
    assert all(refused() for _ in range(3))
    assert probe_inflight() == before  # refused before popping: nothing made invisible
    client.kill()
    client.wait(timeout=10)
    assert wait_until(lambda: not refused(), timeout=20)  # its answers are gone: the budget is back
    # What the refused Pops took is ready again at once, not invisible for their 10 minutes: another reader of the
    # group gets every message but those of the whole answers (16 each) sent to the stalled client. (An answer the
    # kernel's socket buffers took in is done for the broker: it left the budget, and a later Pop was answered.)
    again = pb.PopRequest(topic="big", group="stalled", filter="*", max_messages=8, invisible_ms=60000)
    got = 0
    while answer := broker.stub.Pop(again, timeout=10).messages:
        got += len(answer)
    assert (64 - got) % 16 == 0 and 16 <= 64 - got <= 48, got
