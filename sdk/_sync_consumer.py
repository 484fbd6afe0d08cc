"""The blocking SimpleConsumer (users import it from `popgate` or `popgate.client`): receive and iterate, ack
(waited for or in the background), nack, forward to the DLQ, and give back what an iteration did not yield.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
from popgate_pb.v2 import service_pb2 as pb

from . import _nacks, _resend, _wire, errors
from ._acks import ThreadAcks
from ._at_work import AtWork
from ._base import GIVE_BACK_IN_FLIGHT, Answer, ConsumerBase, deliverable, log_give_back_failures
from ._forks import restarted_after_fork
from ._sync_client import _SyncClient
from ._transport import convert
from .message import Message

# The blocking clients log as `popgate.client`, the module they are imported from (tests/unit/sdk/test_acks.py).
log = logging.getLogger("popgate.client")

Hold = Callable[[list[Message]], None]  # takes a receive's messages into an iteration's hold


class Reads:
    """The receive answers being read (thread-safe): close() cancels them and waits, at most its give-back time, for
    each to give back what it read while the channel is still open — not for one its own thread reads (a close() in
    a signal handler) — tests/unit/sdk/test_give_back.py::test_close_during_a_receives_answer_gives_back_what_it_read,
    `::test_close_in_a_signal_handler_of_the_reading_thread_does_not_wait_for_itself`."""

    def __init__(self) -> None:
        self._restart()
        _live_reads.add(self)

    def _restart(self) -> None:
        """None. A forked child starts so: the calls are its parent's, left to the parent."""
        self._calls = AtWork()  # id(call): the call, and the thread reading it

    def add(self, call: Any) -> None:
        self._calls.begin(id(call), call)

    def done(self, call: Any) -> None:
        self._calls.end(id(call))

    def after_mine(self, then: Callable[[], None]) -> bool:
        """Whether this thread is reading an answer (a close() in a signal handler of a reading thread); if so,
        `then` runs once its reads have ended."""
        return self._calls.after_mine(then)

    def cancel_and_wait(self, timeout: float) -> bool:
        """Whether every read of another thread ended within `timeout` (a close() in a signal handler of a reading
        thread: that read waits for it)."""
        for call in self._calls.what():
            if (cancel := getattr(call, "cancel", None)) is not None:  # a grpc call (a plain iterable has none)
                cancel()
        return self._calls.wait_others(timeout)


_live_reads = restarted_after_fork(Reads._restart)


class SimpleConsumer(ConsumerBase, _SyncClient):
    """Receives messages of a consumer group; you ack each one (or nack it, or forward it to the DLQ).

    A received message stays invisible to the group for ``invisible`` seconds; unless acked
    by then it is delivered again with ``attempt + 1``. Iterating (``for msg in consumer``)
    long-polls forever, retrying transient failures (proxy or broker restarts) with back-off;
    it ends when the consumer is closed. An iteration left early (``break``, an error in the loop's
    body, the consumer closed) gives back the messages of its batch it had not yielded yet: ready
    again at once, with ``attempt + 1`` (a nack with delay 0; best effort, at most 1 s).

    Args:
        endpoint: The proxy's ``HOST:PORT``.
        group: Consumer group name.
        subscriptions: ``{topic: filter}`` where filter is ``"*"`` or tags ``"a || b"``; or topic names.
            Several topics are polled in turn, one per receive.
        batch: Default ``max`` for `receive` and for iteration (1..32).
        invisible: Default invisibility, seconds (a popgate or RocketMQ proxy accepts 10 s .. 12 h).
        wait: Default long-polling time, seconds. Iteration long-polls at least 1 s per receive (``wait=0``
            would make it a busy loop); a held receive still answers as soon as a message comes.
        access_key, secret_key, tls, namespace, request_timeout, retry: As for `Producer`.
    """

    def receive(
        self, *, max: int | None = None, invisible: float | None = None, wait: float | None = None
    ) -> list[Message]:
        """Receive up to ``max`` messages, long-polling up to ``wait`` seconds; ``[]`` when none came.

        Args:
            max: At most this many messages (1..32).
            invisible: Seconds the messages stay invisible to the group unless acked.
            wait: Long-polling time, seconds (0: answer at once).
        """
        return self._retrying(lambda: self._receive_once(max, invisible, wait))

    def _receive_once(
        self, max: int | None, invisible: float | None, wait: float | None, hold: Hold | None = None
    ) -> list[Message]:
        request, timeout = self._receive_plan(max, invisible, wait)
        if self._closed:  # none sent once close() has begun giving back (test_close_interleavings.py::
            raise _resend.client_closed()  # test_a_receive_made_while_close_gives_back_is_not_sent)
        metadata = self._metadata()
        if self._batch_receive is not False:  # many messages per frame, where the proxy serves it
            try:
                call = self._ext.ReceiveMessages(request, timeout=timeout, metadata=metadata)
                messages = self._read(call, request.batch_size, hold)
            except grpc.RpcError as exc:
                if not self._batch_unimplemented(exc):
                    raise
                if self._closed:  # close() began while the proxy said it serves none: the v2 receive is not sent
                    raise _resend.client_closed() from None
            else:
                self._batch_receive = True
                return messages
        call = self._stub.ReceiveMessage(request, timeout=timeout, metadata=metadata)
        return self._read(call, request.batch_size, hold)

    def _read(self, call: Any, asked: int, hold: Hold | None = None) -> list[Message]:
        """The messages of a receive's answer (either framing). An answer that fails after some messages (a proxy
        gone, a deadline) gives them back before the error goes on to the retry —
        tests/unit/sdk/test_give_back.py::test_a_receive_failed_mid_answer_gives_back_what_it_read — and so does one
        that Ctrl-C interrupts (or any other exception) —
        tests/unit/sdk/test_give_back.py::test_a_receive_interrupted_mid_answer_gives_back_what_it_read. So does one
        past `asked` messages, cut there (`Answer`). `hold` takes the messages before the read ends, so a close()
        meanwhile finds them held and gives them back —
        tests/unit/sdk/test_give_back.py::test_close_just_after_an_iterations_receive_gives_back_its_batch."""
        frames = Answer(asked)
        try:
            self._reads.add(call)  # in the `try`: a Ctrl-C right after it still ends the read (test_give_back.py::
            # test_a_ctrl_c_as_a_read_begins_leaves_close_nothing_to_wait_for)
            try:
                for frame in call:
                    if frames.over(frame):
                        call.cancel()
                        raise frames.too_many()
                messages, corrupt = deliverable(log, frames)  # an answer without its status raises, given back
            except BaseException:
                self._give_back(_wire.all_messages(frames))
                raise
            if hold is not None:
                hold(messages)
            self._give_back(corrupt, counted=True)
        finally:
            self._reads.done(call)
        return messages

    def __iter__(self) -> Iterator[Message]:
        """Messages as they come, long-polling forever (transient failures retried without end); ends when the
        client is closed. Messages received but not yet yielded when the loop ends are given back at once."""
        held: list[int] = []  # the keys of the batches receives held (`_read`), until they are given back

        def hold(batch: list[Message]) -> None:
            held.append(self._unyielded.start(batch))

        try:
            while not self.closed:
                try:
                    self._retrying(lambda: self._receive_once(None, None, self._iteration_wait, hold), forever=True)
                except errors.PopgateError:
                    if self._closed:
                        return
                    raise
                while not self.closed and (message := self._unyielded.next(held[-1])) is not None:
                    yield message
                self._end_held(held)
        finally:  # also at `break` (the generator closed), an error in the loop's body, Ctrl-C, or close()
            self._end_held(held)

    def _end_held(self, held: list[int]) -> None:
        """Give back what is left of the batches `held` (an iteration's), each key dropped once its give-back ended,
        so a Ctrl-C anywhere after a receive held its batch still gives it back — tests/unit/sdk/
        test_close_interleavings.py::test_a_ctrl_c_just_after_an_iterations_receive_gives_back_its_batch."""
        while held:
            with self._unyielded.ended(held[-1]) as rest:  # a close() meanwhile waits for it before the channel closes
                self._give_back(rest)
            held.pop()

    def _open(self) -> None:
        self._reads = Reads()
        super()._open()
        self._unwaited = ThreadAcks(log)

    def close(self) -> None:
        """Close the connection, once the acks not waited for have ended (at most 10 s); see `_SyncClient.close`."""
        super().close()

    def _stopping(self) -> None:
        self._unwaited.stop()

    def _closing(self) -> None:
        self._reads.cancel_and_wait(self._give_back_timeout)  # answers being read give back or hold what they read
        self._give_back(self._unyielded.take_all())  # what iterations in progress had not yielded yet
        self._unyielded.wait_given_back(self._give_back_timeout)  # what they had taken to give back themselves

    def _end_channel(self) -> None:
        """A close() in a signal handler of a thread reading an answer closes the channel only once that read has
        ended, after giving back what it read or held — tests/unit/sdk/test_give_back.py::
        test_close_in_a_signal_handler_just_after_its_threads_read_gives_back_the_batch — and one of a thread giving
        back its iteration's batch, once that give-back has ended (`Unyielded.after_mine`)."""
        if not self._reads.after_mine(self._ended_after_read) and not self._unyielded.after_mine(super()._end_channel):
            super()._end_channel()

    def _ended_after_read(self) -> None:
        try:
            self._give_back(self._unyielded.take_all())
        finally:
            super()._end_channel()

    def _give_back(self, messages: list[Message], *, counted: bool = False) -> bool:
        """Make received messages that nobody will handle ready again at once rather than invisible for
        ``invisible`` seconds: messages no caller saw not counted as a delivery (`_undelivered_requests`), where the
        proxy serves that, else (and `counted`: a corrupt body) as a nack with delay 0. Best effort: one attempt
        each, GIVE_BACK_IN_FLIGHT at once, at most GIVE_BACK_TIMEOUT_S in all; a failure is logged at DEBUG (that
        message comes back after ``invisible``). Whether the proxy answered every call (whatever it answered): False
        when one failed to reach it, timed out or was not sent in time."""
        if not messages:
            return True
        if sys.is_finalizing():  # the interpreter is exiting: grpc could start no thread
            return False
        deadline = time.monotonic() + self._give_back_timeout
        if not counted and self._gives_back_undelivered():
            given = self._given_back_undelivered(messages, deadline)
            if given is not None:
                return given
        # A window, not waves: each call that ends lets the next one go, so one call held up (a hung broker) holds
        # up no other — tests/unit/sdk/test_give_back_window.py::test_a_hung_give_back_call_holds_up_no_other. Each
        # request is built as its turn comes, so the first calls go at once however many messages there are.
        window = threading.BoundedSemaphore(GIVE_BACK_IN_FLIGHT)
        calls: list[Any] = []
        for message in messages:
            if (left := deadline - time.monotonic()) <= 0 or not window.acquire(timeout=left):
                break
            request = self._give_back_request(message)
            try:
                call = self._stub.ChangeInvisibleDuration.future(request, timeout=left, metadata=self._metadata())
            except ValueError:  # grpc's "channel closed": close() from another thread
                window.release()
                return False
            call.add_done_callback(lambda _: window.release())
            calls.append(call)
        answers = [call.exception() or call.result() for call in calls]
        log_give_back_failures(log, answers, len(messages))
        return len(answers) == len(messages) and not any(isinstance(answer, BaseException) for answer in answers)

    def _given_back_undelivered(self, messages: list[Message], deadline: float) -> bool | None:
        """`_undelivered_requests` as calls all at once: whether the proxy answered each (as `_give_back`), None when
        it has no ChangeInvisibleMany (nothing was given back)."""
        calls = []
        for request in self._undelivered_requests(messages):
            try:
                calls.append(
                    self._ext.ChangeInvisibleMany.future(
                        request, timeout=max(0.0, deadline - time.monotonic()), metadata=self._metadata()
                    )
                )
            except ValueError:  # grpc's "channel closed": close() from another thread
                return False
        answers = [call.exception() or call.result() for call in calls]
        if any(
            isinstance(a, grpc.RpcError) and self._unimplemented(a, "_many_served", "ChangeInvisibleMany")
            for a in answers
        ):
            return None
        if not all(isinstance(a, BaseException) for a in answers):
            self._many_served = True
        log_give_back_failures(log, answers)
        return not any(isinstance(a, BaseException) for a in answers)

    def ack(self, message: Message, *, wait: bool = True) -> None:
        """Acknowledge one message: it is consumed and never delivered again.

        Transient failures (UNAVAILABLE, TOO_MANY_REQUESTS, broker failover, timeouts) are retried under
        the client's `RetryPolicy`. A re-sent ack answered with a stale handle counts as acked: the broker
        refuses a handle it already acked, so that answer means an earlier attempt whose reply was lost
        did the ack. After a broker crash that answer may mean the opposite (the restarted broker lost the
        ack, or the delivery itself): then a normal return is followed by one more delivery of the message
        (at least once, docs/SDK.md "Errors and retries").

        Args:
            message: A message this consumer received.
            wait: False: return at once and let the ack go on in the background, as NATS's ``msg.ack()`` or
                RocketMQ's ``ackAsync`` (docs/SDK.md "Consume"): a failure is logged at WARNING and the message
                comes again after its invisible time. At most 64 such ack calls are queued or under way per
                consumer (one more waits for one of them); `close` waits for them, at most 10 s.

        Raises:
            InvalidReceiptHandle: The handle is stale (redelivered since, or already acked); only when waiting.
            Timeout: Not retriable: the outcome is unknown. An attempt failed in a way that may have reached
                the broker and no later answer said whether it acked the message (then it never comes again).
            Unavailable: With ``wait=False``, the consumer is closed (or closing), or the OS refused the thread
                that would send it (retriable; not acked).
            ValueError: The message has no topic or no receipt handle (no receive returned it), waiting or not.
        """
        if not wait:
            self.ack_many([message], wait=False)
            return
        failures = self._ack(self._ack_plan([message]))
        if failures:
            raise failures[0][1]

    def ack_many(self, messages: Iterable[Message], *, wait: bool = True) -> None:
        """Acknowledge many messages in as few AckMessage calls as possible (one per topic and 1024).

        Entries that fail with a retriable error are re-sent alone, as `ack` retries.

        Args:
            messages: Messages this consumer received.
            wait: False: return at once and let the acks go on in the background, as `ack` says.

        Raises:
            AckError: Some messages were not acked, or not known to be (``outcome_unknown``, as `ack`'s
                `Timeout`); ``failures`` lists them with their errors. Only when waiting.
            Unavailable: With ``wait=False``, the consumer is closed (or closing), or the OS refused the thread
                that would send them (retriable; not acked).
            ValueError: A message has no topic or no receipt handle (no receive returned it), waiting or not.
        """
        plan = self._ack_plan(messages)  # a bad argument raises here, to the caller, waiting or not
        if not wait:
            self._unwaited.start(lambda: self._ack(plan), sum(len(r.entries) for r in plan))
            return
        failures = self._ack(plan)
        if failures:
            raise errors.AckError(failures)

    def _ack(self, plan: list[pb.AckMessageRequest]) -> list[tuple[str, errors.PopgateError]]:
        failures: list[tuple[str, errors.PopgateError]] = []
        for request in plan:
            failures += self._ack_request(_resend.PendingAck(request))
        return failures

    def _ack_request(self, pending: _resend.PendingAck) -> list[tuple[str, errors.PopgateError]]:
        def op() -> list[tuple[str, errors.PopgateError]]:
            request = pending.next_request()
            response = self._stub.AckMessage(request, timeout=self.options.request_timeout, metadata=self._metadata())
            return pending.read(response)

        try:
            return self._retrying(op, failed=pending.attempt_failed)
        except errors.PopgateError as exc:
            return pending.given_up(exc)

    def nack(self, message: Message, delay: float = 0.0) -> Message:
        """Give a message back: it is delivered again after ``delay`` seconds (ChangeInvisibleDuration).

        The message's ``receipt_handle`` is replaced by the new one (also returned). Transient failures
        are retried as for `ack`.

        Args:
            message: A message this consumer received.
            delay: Seconds until it is delivered again (0: at once).

        Returns:
            The same message, with its new receipt handle.

        Raises:
            InvalidReceiptHandle: The handle was stale at the first attempt.
            Timeout: Not retriable: the outcome is unknown. An attempt failed in a way that may have
                reached the broker, and the retry found the handle already replaced, most likely by that
                attempt; the message will be delivered again after ``delay``, but the new handle was lost.
        """
        request = _wire.change_invisible_request(self.group, message, delay, namespace=self.options.namespace)
        attempts = itertools.count(1)

        def op() -> str:
            resent = next(attempts) > 1
            response = self._stub.ChangeInvisibleDuration(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            return _resend.new_handle(response, resent=resent)

        message.receipt_handle = self._retrying(op)
        return message

    def nack_many(self, messages: Iterable[Message], delay: float = 0.0) -> list[Message]:
        """Give many messages back in as few calls as possible (one per topic and 1024): each is delivered again
        after ``delay`` seconds.

        Each message nacked gets its new receipt handle, as `nack` gives it, even when others fail. Entries that
        fail with a retriable error are sent again alone, as `nack` retries. A proxy without popgate's
        ChangeInvisibleMany (an older one, a RocketMQ proxy) gets a ChangeInvisibleDuration per message.

        Args:
            messages: Messages this consumer received.
            delay: Seconds until they are delivered again (0: at once).

        Returns:
            The messages, in the order given.

        Raises:
            NackError: Some messages were not nacked, or not known to be (``outcome_unknown``, as `nack`'s
                `Timeout`); ``failures`` lists them with their errors. The others were nacked.
            ValueError: A message has no topic or no receipt handle (no receive returned it), or ``delay`` is
                not a duration; nothing was sent.
        """
        listed = list(messages)
        failures: list[tuple[str, errors.PopgateError]] = []
        for pending in _nacks.plan(self.group, listed, delay, namespace=self.options.namespace):
            failures += self._nack_request(pending)
        if failures:
            raise errors.NackError(failures)
        return listed

    def _nack_request(self, pending: _nacks.PendingNack) -> _nacks.Failures:
        def op() -> _nacks.Failures:
            return pending.read(self._change_invisible_many(pending))

        try:
            return self._retrying(op, failed=pending.attempt_failed)
        except errors.PopgateError as exc:
            return pending.given_up(exc)

    def _change_invisible_many(self, pending: _nacks.PendingNack) -> _nacks.Outcome:
        """One attempt of the messages left: ChangeInvisibleMany, else (a proxy without it: nothing was served) a
        ChangeInvisibleDuration each, at most GIVE_BACK_IN_FLIGHT at once —
        tests/integration/sdk/test_nack_many.py::test_nack_many_against_a_proxy_without_it_nacks_each_message."""
        timeout = self.options.request_timeout
        if self._many_served is not False:
            request = pending.next_request()
            try:
                response = self._ext.ChangeInvisibleMany(request, timeout=timeout, metadata=self._metadata())
                self._many_served = True
                return _nacks.outcome_of(response, len(request.entries))
            except grpc.RpcError as exc:
                if not self._unimplemented(exc, "_many_served", "ChangeInvisibleMany"):
                    raise
        requests = pending.single_requests()
        outcome: _nacks.Outcome = []
        for i in range(0, len(requests), GIVE_BACK_IN_FLIGHT):
            calls: list[Any] = []
            for single in requests[i : i + GIVE_BACK_IN_FLIGHT]:
                try:
                    calls.append(
                        self._stub.ChangeInvisibleDuration.future(single, timeout=timeout, metadata=self._metadata())
                    )
                except ValueError:  # grpc's "channel closed" (close() from another thread): this one never left
                    calls.append(None)
            for call in calls:
                if call is None:
                    outcome.append(_resend.client_closed())
                    continue
                try:
                    outcome.append(_nacks.outcome_of_one(call.result()))
                except grpc.RpcError as exc:
                    outcome.append(convert(exc, tls=self.options.tls))
        return outcome

    def forward_to_dlq(self, message: Message) -> None:
        """Move a message to the group's dead-letter topic ``%DLQ%<group>`` now.

        Retried as `ack` is; a re-send answered with a stale handle counts as forwarded.

        Args:
            message: A message this consumer received.
        """
        request = _wire.dlq_request(self.group, message, namespace=self.options.namespace)
        attempts = itertools.count(1)

        def op() -> None:
            resent = next(attempts) > 1
            response = self._stub.ForwardMessageToDeadLetterQueue(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            _resend.dead_lettered(response, resent=resent)

        self._retrying(op)
