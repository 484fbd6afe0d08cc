"""Acks not waited for (``wait=False``, sdk/_acks.py), both clients, without sockets: bounded per consumer, waited
for by close (at most CLOSE_WAIT_S), refused once closing. Their retries and logged failures against a fake stub:
test_acks.py."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time

import pytest
from popgate_pb.v2 import service_pb2 as pb

from popgate import Message, SimpleConsumer, _acks, aio, errors
from tests.unit.sdk.fakes import FakeStub

Failures = list[tuple[str, errors.PopgateError]]


def message(i: int) -> Message:
    return Message(body=b"x", topic="t", message_id=f"id{i}", receipt_handle=f"rh{i}")


def ids(plan: list[pb.AckMessageRequest]) -> list[str]:
    return [e.message_id for request in plan for e in request.entries]


async def test_the_asyncio_client_bounds_them_and_close_waits_for_them() -> None:
    release = asyncio.Event()
    acked: list[str] = []

    async def held_ack(plan: list[pb.AckMessageRequest]) -> Failures:
        await release.wait()
        acked.extend(ids(plan))
        return []

    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = held_ack  # type: ignore[method-assign]
    for i in range(_acks.MAX_UNWAITED_ACKS):
        await asyncio.wait_for(consumer.ack(message(i), wait=False), 1)  # each returns at once
    one_more = asyncio.ensure_future(consumer.ack(message(_acks.MAX_UNWAITED_ACKS), wait=False))
    await asyncio.sleep(0.05)
    assert not one_more.done()  # waits for a slot
    release.set()
    await asyncio.wait_for(one_more, 1)
    release.clear()
    await consumer.ack(message(100), wait=False)
    closing = asyncio.ensure_future(consumer.close())
    await asyncio.sleep(0.05)
    assert not closing.done()  # waits for the ack under way
    with pytest.raises(errors.Unavailable):
        await consumer.ack(message(101), wait=False)  # closing: refused
    release.set()
    await asyncio.wait_for(closing, 1)
    assert sorted(acked) == sorted([f"id{i}" for i in range(_acks.MAX_UNWAITED_ACKS + 1)] + ["id100"])


def test_the_blocking_client_bounds_them_and_close_waits_for_them() -> None:
    release = threading.Event()
    acked: list[str] = []

    def held_ack(plan: list[pb.AckMessageRequest]) -> Failures:
        release.wait(10)
        acked.extend(ids(plan))
        return []

    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = held_ack  # type: ignore[method-assign]
    for i in range(_acks.MAX_UNWAITED_ACKS):
        consumer.ack(message(i), wait=False)  # queued or under way: returns at once
    outcome: list[str] = []

    def ack_one_more() -> None:
        try:
            consumer.ack(message(_acks.MAX_UNWAITED_ACKS), wait=False)
            outcome.append("queued")
        except errors.Unavailable:
            outcome.append("refused")

    one_more = threading.Thread(target=ack_one_more)
    one_more.start()
    one_more.join(0.05)
    assert one_more.is_alive()  # waits for a slot
    closing = threading.Thread(target=consumer.close)
    closing.start()
    closing.join(0.05)
    assert closing.is_alive()  # waits for what is queued or under way
    release.set()
    one_more.join(5)
    closing.join(5)
    assert not closing.is_alive()
    # The one that waited for a slot got it before the close refused new ones (and was sent), or was refused.
    assert len(acked) == _acks.MAX_UNWAITED_ACKS + (outcome == ["queued"])
    with pytest.raises(errors.Unavailable):
        consumer.ack(message(200), wait=False)  # closed: refused
    assert not [t for t in threading.enumerate() if t.name.startswith("popgate-ack")]  # nothing left running


def test_the_blocking_client_sends_an_ack_while_an_earlier_one_hangs() -> None:
    """An ack call retrying against a broker that does not answer holds up no other: the ones queued after it (for
    messages of healthy brokers) are sent meanwhile, as the asyncio client's tasks are."""
    hung, sent = threading.Event(), threading.Event()

    def ack(plan: list[pb.AckMessageRequest]) -> Failures:
        if ids(plan) == ["id1"]:
            hung.wait(10)  # a broker stopped: the call retries for its whole budget
        else:
            sent.set()
        return []

    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = ack  # type: ignore[method-assign]
    try:
        consumer.ack(message(1), wait=False)
        consumer.ack_many([message(2), message(3)], wait=False)
        assert sent.wait(5)  # before the hung one ended
    finally:
        hung.set()
        consumer.close()


def test_the_blocking_client_sends_acks_one_after_another_on_one_thread() -> None:
    """Acks that end before the next one starts are all sent by the same thread: no thread per ack."""
    threads: set[threading.Thread] = set()

    def ack(plan: list[pb.AckMessageRequest]) -> Failures:
        threads.add(threading.current_thread())
        return []

    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = ack  # type: ignore[method-assign]
    with consumer:
        for i in range(20):
            consumer.ack(message(i), wait=False)
            deadline = time.monotonic() + 5
            while consumer._unwaited._futures and time.monotonic() < deadline:  # until that ack ended
                time.sleep(0.001)
    assert len(threads) == 1


def test_an_ack_after_the_blocking_clients_threads_ended_idle_starts_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_acks, "THREAD_IDLE_S", 0.01)
    sent = threading.Event()
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = lambda plan: sent.set() or []  # type: ignore[method-assign]
    with consumer:
        consumer.ack(message(1), wait=False)
        assert sent.wait(5)
        deadline = time.monotonic() + 5
        while consumer._unwaited._threads and time.monotonic() < deadline:  # its thread ends, idle
            time.sleep(0.001)
        assert not consumer._unwaited._threads
        sent.clear()
        consumer.ack(message(2), wait=False)
        assert sent.wait(5)


def test_a_second_close_of_the_blocking_client_waits_for_the_first_ones_wait() -> None:
    """close() called again while a first close() waits for the acks under way returns only once they ended, with
    the connection still open for them, as the asyncio client's second close() does."""
    release = threading.Event()
    open_when_sent: list[bool] = []

    def held_ack(plan: list[pb.AckMessageRequest]) -> Failures:
        release.wait(10)
        open_when_sent.append(not consumer._closed)
        return []

    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = held_ack  # type: ignore[method-assign]
    consumer.ack(message(1), wait=False)
    first = threading.Thread(target=consumer.close)
    first.start()
    deadline = time.monotonic() + 5
    while not consumer._unwaited._stopped and time.monotonic() < deadline:  # the first close() is waiting
        time.sleep(0.001)
    second = threading.Thread(target=consumer.close)
    second.start()
    second.join(0.05)
    assert second.is_alive()  # waits for the first close()'s wait
    release.set()
    second.join(5)
    first.join(5)
    assert not second.is_alive() and not first.is_alive()
    assert open_when_sent == [True]


def test_an_ack_the_os_refuses_a_thread_for_raises_unavailable_and_leaks_nothing() -> None:
    """The OS refusing the blocking client's ack thread (out of processes or memory) fails that ack with a retriable
    Unavailable and keeps no slot and no thread: once threads are allowed again, unwaited acks are sent and close()
    returns."""
    sent = threading.Event()

    def ack(plan: list[pb.AckMessageRequest]) -> Failures:
        sent.set()
        return []

    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = ack  # type: ignore[method-assign]

    def refuse(thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(threading.Thread, "start", refuse)
        for i in range(_acks.MAX_UNWAITED_ACKS + 1):
            with pytest.raises(errors.Unavailable) as info:
                consumer.ack(message(i), wait=False)
            assert info.value.retriable and "can't start new thread" in str(info.value)
    later = threading.Thread(target=consumer.ack, args=(message(100),), kwargs={"wait": False}, daemon=True)
    later.start()
    later.join(5)
    assert not later.is_alive()  # a slot was free
    assert sent.wait(5)
    consumer.close()  # raises nothing


def test_a_bad_argument_raises_to_the_caller_waiting_or_not() -> None:
    with SimpleConsumer("127.0.0.1:1", "g", "t") as consumer, pytest.raises((TypeError, AttributeError)):
        consumer.ack_many([object()], wait=False)  # type: ignore[list-item]


NEVER_RECEIVED = [Message(b"x", topic="t", message_id="m"), Message(b"x", message_id="m", receipt_handle="rh")]


@pytest.mark.parametrize("never_received", NEVER_RECEIVED, ids=["no receipt handle", "no topic"])
@pytest.mark.parametrize("wait", [True, False])
async def test_a_message_never_received_is_refused_at_the_call_waiting_or_not(
    never_received: Message, wait: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Acking a message no receive returned raises ValueError from both clients (nothing sent, nothing logged), rather
    than a warning that it comes again."""
    with SimpleConsumer("127.0.0.1:1", "g", "t") as consumer, pytest.raises(ValueError, match="received"):
        consumer.ack(never_received, wait=wait)
    async with aio.SimpleConsumer("127.0.0.1:1", "g", "t") as aio_consumer:
        with pytest.raises(ValueError, match="received"):
            await aio_consumer.ack_many([message(1), never_received], wait=wait)
    assert not caplog.records


async def test_close_waits_at_most_close_wait_s_then_cancels(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_acks, "CLOSE_WAIT_S", 0.05)
    never = asyncio.Event()

    async def hung_ack(plan: list[pb.AckMessageRequest]) -> Failures:
        await never.wait()
        return []

    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = hung_ack  # type: ignore[method-assign]
    await consumer.ack(message(1), wait=False)
    with caplog.at_level(logging.WARNING, logger="popgate.aio"):
        await asyncio.wait_for(consumer.close(), 2)
    assert "1 ack call(s) not waited for were still under way" in caplog.text


def test_acks_cut_short_by_the_end_of_asyncio_run_are_sent_again_and_waited_for() -> None:
    """asyncio.run cancels the tasks still running when its coroutine returns: an ack not waited for is sent again
    (a re-send: a stale handle counts as acked) and the run's end waits for it, as close() would."""
    sent: list[tuple[list[str], bool]] = []

    async def ack(plan: list[pb.AckMessageRequest], *, resent: bool = False) -> Failures:
        if not resent:
            await asyncio.Event().wait()  # under way when the run ends: cancelled
        sent.append((ids(plan), resent))
        return []

    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = ack  # type: ignore[method-assign]

    async def main() -> None:
        await consumer.ack(message(1), wait=False)
        await asyncio.sleep(0)  # its call under way
        await consumer.ack(message(2), wait=False)  # not started yet

    asyncio.run(main())
    assert sorted(sent) == [(["id1"], True), (["id2"], True)]


async def test_acks_sent_again_as_a_loop_ends_are_cancelled_after_close_wait_s_and_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_acks, "CLOSE_WAIT_S", 0.05)

    async def hung_ack(plan: list[pb.AckMessageRequest], *, resent: bool = False) -> Failures:
        await asyncio.Event().wait()
        return []

    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._ack = hung_ack  # type: ignore[method-assign]

    async def main() -> None:
        await consumer.ack(message(1), wait=False)

    with caplog.at_level(logging.WARNING, logger="popgate.aio"):
        await asyncio.to_thread(asyncio.run, main())
    assert "1 ack call(s) not waited for were still under way" in caplog.text


EXIT_SCRIPT = """
import time
from popgate import _acks
import logging
_acks.CLOSE_WAIT_S = 0.5
acks = _acks.ThreadAcks(logging.getLogger("t"))
for _ in range(3):
    acks.start(lambda: time.sleep(30) or [], 1)  # each an ack retrying against a proxy gone
print("queued", flush=True)
"""


def test_an_unclosed_consumers_acks_hold_exit_up_at_most_the_close_wait() -> None:
    """A script that queued acks not waited for and ends without closing its consumer exits once they were waited
    for as close() would (CLOSE_WAIT_S, here 0.5 s), not after every queued ack's retries."""
    started = time.monotonic()
    child = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=20)
    assert (child.returncode, child.stdout) == (0, "queued\n")
    assert time.monotonic() - started < 10
    assert "3 ack call(s) not waited for were still under way" in child.stderr


def test_an_ack_not_waited_for_after_close_fails_at_once_while_acks_hold_every_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """close() gave up on MAX_UNWAITED_ACKS hung acks: an ack not waited for afterwards raises Unavailable at once,
    rather than waiting for one of their places."""
    monkeypatch.setattr(_acks, "CLOSE_WAIT_S", 0.05)
    fake = FakeStub()
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
    gate = threading.Event()
    consumer._ack = lambda plan: gate.wait(30) and []  # until the test ends  # type: ignore[method-assign,assignment]
    for i in range(_acks.MAX_UNWAITED_ACKS):
        consumer.ack(fake.message(f"h{i}"), wait=False)
    consumer.close()
    outcome: list[BaseException] = []

    def late_ack() -> None:
        try:
            consumer.ack(fake.message("late"), wait=False)
        except errors.Unavailable as exc:
            outcome.append(exc)

    acker = threading.Thread(target=late_ack)
    acker.start()
    acker.join(10)
    held = not gate.is_set()
    gate.set()
    assert held and [type(e) for e in outcome] == [errors.Unavailable]
