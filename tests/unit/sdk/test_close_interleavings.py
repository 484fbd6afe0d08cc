"""A blocking consumer's close() at awkward moments of its iterations and calls: what was received is either handed
to the application or given back before the channel closes, and nothing is sent once close() is under way. Fakes,
no sockets; each interleaving is forced (events, or a signal's exception raised from a trace function)."""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from types import FrameType
from typing import Any

import pytest
from popgate_pb.v2 import service_pb2 as pb

import popgate
from popgate import Message, RetryPolicy, SimpleConsumer, Unavailable
from tests.unit.sdk.fakes import FakeStub, closed_then_forked
from tests.unit.sdk.test_give_back import IDS, SyncStub, answer, given_back, served_closing

SDK = os.path.dirname(popgate.__file__)


def consumer_of(fake: FakeStub, ids: list[str]) -> tuple[SimpleConsumer, SyncStub]:
    """A consumer whose first receive is answered with `ids`, over a channel whose calls fail once closed."""
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    return consumer, served_closing(consumer, SyncStub(fake, answer(fake, ids)))


@contextlib.contextmanager
def interrupted(line_event: int, armed: Callable[[], bool]) -> Iterator[None]:
    """Run the caller's block with a Ctrl-C (KeyboardInterrupt, as a signal's exception between two bytecodes) raised
    at the `line_event`-th line of the SDK's code that this thread runs once `armed()` — not at a `with` statement's
    own line, whose lock a signal's exception leaves held in CPython whatever the code does."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal line_event
        if (
            event == "line"
            and armed()
            and not linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip().startswith("with ")
        ):
            line_event -= 1
            if line_event == 0:
                sys.settrace(None)
                raise KeyboardInterrupt
        return local

    sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename.startswith(SDK) else None)
    try:
        yield
    finally:
        sys.settrace(None)


def test_close_in_a_signal_handler_during_the_iterations_give_back_lets_it_finish() -> None:
    """`break` out of an iteration: while it gives back the rest of its batch, a signal handler on the same thread
    calls close(). The channel closes once that give-back has ended, not under its calls."""
    fake = FakeStub()
    consumer, stub = consumer_of(fake, IDS)
    give_back_call = stub.future

    def signalled(request: pb.ChangeInvisibleDurationRequest, **kwargs: Any) -> Future[Any]:
        done = give_back_call(request, **kwargs)
        if request.message_id == IDS[1]:
            consumer.close()  # a SIGTERM handler's, on this thread, m1's give-back just sent
        return done

    stub.future = signalled  # type: ignore[method-assign]
    for message in consumer:
        assert message.message_id == IDS[0]
        break
    assert given_back(fake) == IDS[1:] and stub.closed


@pytest.mark.parametrize("line_event", range(1, 9))
def test_a_ctrl_c_in_an_iterations_give_back_leaves_close_nothing_to_wait_for(line_event: int) -> None:
    """Ctrl-C at each line an iteration's end runs once it has taken its batch to give back, before that give-back
    begins: a close() afterwards from another thread finds no give-back under way to wait for."""
    fake = FakeStub()
    consumer, stub = consumer_of(fake, IDS)
    taken, giving = threading.Event(), threading.Event()
    end, give_back = consumer._unyielded.end, consumer._give_back

    def taken_noted(key: int) -> list[Message]:
        rest = end(key)
        taken.set()
        return rest

    def giving_noted(messages: list[Message], *, counted: bool = False) -> bool:
        if messages:  # not a receive's (none corrupt)
            giving.set()
        return give_back(messages, counted=counted)

    consumer._unyielded.end = taken_noted  # type: ignore[method-assign]
    consumer._give_back = giving_noted  # type: ignore[method-assign]
    iteration = iter(consumer)
    assert next(iteration).message_id == IDS[0]
    with interrupted(line_event, lambda: taken.is_set() and not giving.is_set()):
        with contextlib.suppress(KeyboardInterrupt):
            iteration.close()  # the `break`
    waited: list[bool] = []
    wait = consumer._unyielded.wait_given_back
    consumer._unyielded.wait_given_back = lambda timeout: waited.append(wait(timeout)) or waited[-1]  # type: ignore[method-assign]
    closer = threading.Thread(target=consumer.close)
    closer.start()
    closer.join(10)
    assert waited == [True] and stub.closed


def test_a_ctrl_c_just_after_an_iterations_receive_gives_back_its_batch() -> None:
    """Ctrl-C as the iteration resumes after its receive held the batch, before it yields any: the iteration ends
    with KeyboardInterrupt and gives the batch back, rather than leaving it held (invisible) until close()."""
    fake = FakeStub()
    consumer, _ = consumer_of(fake, IDS)
    held, start = threading.Event(), consumer._unyielded.start

    def noted(batch: Any) -> int:
        key = start(batch)
        held.set()
        return key

    consumer._unyielded.start = noted  # type: ignore[method-assign]
    with interrupted(1, held.is_set):
        with pytest.raises(KeyboardInterrupt):
            next(iter(consumer))
    assert given_back(fake) == IDS
    consumer.close()


def test_a_receive_made_while_close_gives_back_is_not_sent() -> None:
    """Another thread's receive() once close() has marked the consumer closed and taken what iterations hold:
    Unavailable, nothing sent, rather than messages returned that nobody can ack any more or gives back."""
    fake = FakeStub()
    consumer, stub = consumer_of(fake, IDS[:2])
    got: list[Any] = []
    wait = consumer._unyielded.wait_given_back

    def meanwhile(timeout: float) -> bool:
        try:  # another thread's receive() at this moment (run here: the moment is the point)
            got.append(consumer.receive(wait=0))
        except Unavailable as exc:
            got.append(exc)
        return wait(timeout)

    consumer._unyielded.wait_given_back = meanwhile  # type: ignore[method-assign]
    consumer.close()
    assert [type(g) for g in got] == [Unavailable] and "nothing was sent" in str(got[0])
    assert stub.answers and stub.closed  # its answer was never asked for


def test_a_consumer_closed_before_a_fork_sends_nothing_in_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer closed, then the process forked: the child's calls raise Unavailable, opening no channel."""
    fake = FakeStub()
    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    connected = closed_then_forked(consumer, monkeypatch)
    consumer._stub_ = fake  # what a call that went on would reach
    with pytest.raises(Unavailable):
        consumer.ack(fake.message("a0"))
    with pytest.raises(Unavailable):
        consumer.receive(wait=0)
    assert connected == [] and fake.acked == []


def test_an_iteration_yields_nothing_once_close_was_called() -> None:
    """close() on another thread waits for an ack not waited for while an iteration's receive is answered: `closed`
    is True and the iteration yields none of that batch (whose acks not waited for close() would refuse): it gives
    the batch back, the channel still open, and ends."""
    fake = FakeStub()
    gate, receiving, stopping = threading.Event(), threading.Event(), threading.Event()

    def once_close_began(frames: Iterable[pb.ReceiveMessageResponse]) -> Iterator[pb.ReceiveMessageResponse]:
        receiving.set()
        assert stopping.wait(10)
        yield from frames

    consumer = SimpleConsumer("127.0.0.1:1", "g", "t", retry=RetryPolicy(max_attempts=1))
    stub = served_closing(consumer, SyncStub(fake, once_close_began(answer(fake, IDS))))
    consumer._ack = lambda plan: gate.wait(10) and []  # type: ignore[method-assign,assignment]
    consumer.ack(fake.message("old"), wait=False)  # under way as close() begins
    stop = consumer._unwaited.stop

    def noted() -> None:
        stopping.set()
        stop()

    consumer._unwaited.stop = noted  # type: ignore[method-assign]
    yielded: list[Message] = []
    iterating = threading.Thread(target=lambda: yielded.extend(consumer))
    iterating.start()
    assert receiving.wait(10)
    closer = threading.Thread(target=consumer.close)
    closer.start()
    iterating.join(10)
    assert consumer.closed and yielded == [] and not iterating.is_alive()
    assert given_back(fake) == IDS and not stub.closed
    gate.set()
    closer.join(10)
    assert stub.closed
