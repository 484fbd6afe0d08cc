"""The asyncio SimpleConsumer (users import it from `popgate.aio`): receive and iterate (``async for``), ack
(waited for or in the background), nack, forward to the DLQ, and give back what an iteration did not yield or a
cancelled receive had read, in tasks that `close` and the loop's shutdown wait for.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

import grpc
from popgate_pb.v2 import service_pb2 as pb

from . import _joining, _nacks, _resend, _session, _waiting, _wire, errors
from ._acks import AsyncAcks
from ._again import Again, WaitSpent
from ._aio_client import _AsyncClient, answered
from ._base import GIVE_BACK_IN_FLIGHT, Answer, ConsumerBase, deliverable, log_give_back_failures
from ._transport import convert
from .message import Message

# The asyncio clients log as `popgate.aio`, the module they are imported from (tests/unit/sdk/test_ack_nowait.py).
log = logging.getLogger("popgate.aio")


class SimpleConsumer(ConsumerBase, _AsyncClient):
    """asyncio SimpleConsumer; arguments and behaviour as `sdk.SimpleConsumer` (``async for`` iterates).

    A `receive` cancelled while its answer comes in gives back the messages it had read, in a task of its
    own that `close` (and the end of `asyncio.run`) waits for.
    """

    async def receive(
        self, *, max: int | None = None, invisible: float | None = None, wait: float | None = None
    ) -> list[Message]:
        """Receive up to ``max`` messages, long-polling up to ``wait`` seconds; see `sdk.SimpleConsumer.receive`."""
        return await self._retrying(lambda: self._receive_once(max, invisible, wait))

    async def _receive_once(self, max: int | None, invisible: float | None, wait: float | None) -> list[Message]:
        loop = asyncio.get_running_loop()
        request, timeout = self._receive_plan(max, invisible, wait)
        again = Again(self.wait if wait is None else wait, loop.time(), self._ends_back_off)
        # Cancelled while its answer comes in, a receive on the Session stream gives back what it had read and what
        # still comes (`_orphaned`); on the RPCs, `_read` does.
        frames = await self._session_receive(request, timeout)
        while frames is _joining.CUT_SHORT or isinstance(frames, _session.Ended):
            # Cut short by the receives it was joined with, or its stream ended by the proxy: asked again for the rest
            # of its wait (`_again`) — tests/integration/sdk/test_joined_receives.py::test_a_receive_cut_short_waits_
            # out_the_rest_of_its_wait, test_connection_age.py::test_a_receive_waiting_longer_than_connections_live_
            # waits_out_its_wait_across_them.
            if isinstance(frames, _session.Ended):
                if (delay := again.ended(loop.time())) is None:
                    spent = WaitSpent if again.backed_off else errors.Unavailable
                    raise spent(frames.message, code_name=frames.code_name, retriable=True)
                if delay:
                    await self._back_off(delay)
            elif not again.cut_short(loop.time()):
                return []
            request, timeout = self._receive_plan(max, invisible, again.asking(loop.time()), keep=False)
            frames = await self._session_receive(request, timeout)
        if frames is None and again.again:
            # The Session is served no more (the next stream reached another proxy): the unary receive asks the
            # whole wait, as a retry does (RocketMQ's proxy refuses a poll shorter than its minimum) —
            # tests/unit/sdk/test_retry_loop.py::test_a_receive_whose_next_stream_is_unimplemented_asks_its_whole_wait.
            request, timeout = self._receive_plan(max, invisible, wait)
        if frames is not None:
            self._batch_receive = True
            return await self._delivered(frames)
        metadata = self._metadata()
        if self._batch_receive is not False:  # many messages per frame, where the proxy serves it
            try:
                call = self._ext_stub.ReceiveMessages(request, timeout=timeout, metadata=metadata)
                messages = await self._read(call, request.batch_size)
            except grpc.RpcError as exc:
                if not self._batch_unimplemented(exc):
                    raise
            else:
                self._batch_receive = True
                return messages
        call = self._stub.ReceiveMessage(request, timeout=timeout, metadata=metadata)
        return await self._read(call, request.batch_size)

    def _ends_back_off(self) -> Iterator[float]:
        return self.options.retry.delays(forever=True)

    async def _session_receive(self, request: pb.ReceiveMessageRequest, within_s: float) -> Any:
        """The answer's frames on the Session stream (None where the proxy serves none), or the `_session.Ended`
        its stream ended with, when the proxy ended the stream before answering."""
        try:
            return await self._over_session("receive", request, within_s)
        except _session.Ended as ended:
            return ended

    async def _read(self, call: Any, asked: int) -> list[Message]:
        """The messages of a receive's answer (either framing); one past `asked` messages is cut there (`Answer`)
        and what it brought given back, as below."""
        frames = Answer(asked)
        try:
            async for frame in call:
                if frames.over(answered(frame)):
                    call.cancel()
                    raise frames.too_many()
        except (asyncio.CancelledError, grpc.RpcError, errors.ServerError):
            # Cancelled or failed mid-answer: the messages read so far reach no one; give them back in the background
            # (this task may be being cancelled) rather than leave them invisible for `invisible` —
            # tests/unit/sdk/test_give_back.py::test_an_async_receive_failed_mid_answer_gives_back_what_it_read.
            await self._give_back_later(_wire.all_messages(frames))
            raise
        return await self._delivered(frames)

    async def _delivered(self, frames: list[Any]) -> list[Message]:
        """`deliverable`: the messages of an answer to deliver, those whose body is corrupt given back in the
        background, and all of them when the answer fails (an error status, or none: test_no_status.py)."""
        try:
            messages, corrupt = deliverable(log, frames)
        except errors.PopgateError:
            await self._give_back_later(_wire.all_messages(frames))
            raise
        await self._give_back_later(corrupt, counted=True)
        return messages

    def __aiter__(self) -> AsyncIterator[Message]:
        """Messages as they come, long-polling forever (``async for``); see `sdk.SimpleConsumer.__iter__`."""
        return self._messages()

    async def _messages(self) -> AsyncIterator[Message]:
        while not self.closed:
            try:
                batch = await self._retrying(lambda: self._receive_once(None, None, self._iteration_wait), forever=True)
            except errors.PopgateError:
                if self._closed:
                    return
                raise
            key = self._unyielded.start(batch)
            try:
                while not self.closed and (message := self._unyielded.next(key)) is not None:
                    yield message
            finally:  # also at `break` (the generator is closed: aclose()), an error in the loop's body, or close()
                await self._give_back_tracked(self._unyielded.end(key))

    async def _closing(self) -> None:
        await self._give_back(self._unyielded.take_all())  # what iterations in progress had not yielded yet
        await self._given_back()
        if self._shutdown_guard is not None:
            await self._shutdown_guard.aclose()

    def _open(self) -> None:
        # No connection yet (made on first use, inside the loop): only the give-backs and the acks not waited for
        # running in the background.
        self._giving_back: set[asyncio.Future[None]] = set()
        self._unwaited = AsyncAcks(log)

    async def close(self) -> None:
        """Close the connection, once the acks not waited for have ended (at most 10 s); see `_AsyncClient.close`."""
        await super().close()

    async def _stopping(self) -> None:
        await self._unwaited.stop()

    async def _session_closed(self) -> None:
        # An iteration whose receive was answered (or failed by the stream's close) resumes before this sleep ends,
        # starting its give-back, which the channel stays open for —
        # tests/unit/sdk/test_give_back.py::test_a_batch_answered_as_close_begins_is_given_back_on_one_stream.
        await asyncio.sleep(0)
        await self._given_back()

    async def _give_back_tracked(self, messages: list[Message]) -> None:
        """`_give_back` in a task that `close` waits for before the channel closes (cancelled with its caller)."""
        if not messages:
            return
        await self._giving_back_task(messages)

    async def _give_back_later(self, messages: list[Message], *, counted: bool = False) -> None:
        """`_give_back` in a task of its own (the caller is being cancelled), held until done and awaited by
        `close` and by the loop's shutdown."""
        if not messages or self._channel is None:  # closed (or never connected)
            return
        self._giving_back_task(messages, counted=counted)
        await self._awaited_at_loop_end()

    def _giving_back_task(self, messages: list[Message], *, counted: bool = False) -> asyncio.Future[None]:
        """`_give_back` in a task of its own, among those `close` waits for (`_given_back`)."""
        task = asyncio.ensure_future(self._give_back(messages, counted=counted))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)
        return task

    async def _awaited_at_loop_end(self) -> None:
        """Have the end of this event loop wait for the give-backs and acks not waited for still under way (a
        second loop's too) —
        tests/unit/sdk/test_give_back.py::test_a_second_asyncio_run_gives_back_a_receive_cancelled_mid_answer."""
        self._guard_loop_end(asyncio.get_running_loop())

    async def _loop_ending(self) -> None:
        # A give-back started by a task the loop's end cancelled is not among the tasks asyncio.run waits for, and a
        # closed loop would destroy it pending ("Task was destroyed but it is pending!").
        await self._given_back()
        await self._unwaited.loop_ended()  # those the loop cancelled are sent again: waited for, as close() does

    async def _given_back(self) -> None:
        """Wait for the give-backs running in the background now (each ends within GIVE_BACK_TIMEOUT_S), not for
        those started meanwhile: a stream that keeps handing messages to give back does not hold close() —
        tests/unit/sdk/test_give_back.py::test_close_waits_only_for_the_give_backs_under_way_when_it_began (close
        waits again once the stream is closed, for those handed in until then)."""
        if self._giving_back:
            await asyncio.wait(set(self._giving_back))

    async def _give_back(self, messages: list[Message], *, counted: bool = False) -> None:
        """Make received messages that nobody will handle ready again at once; see `sdk.SimpleConsumer._give_back`."""
        if not messages:
            return
        if self._channel is None:  # closed, or never connected
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._give_back_timeout
        if not counted and self._gives_back_undelivered() and await self._given_back_undelivered(messages, deadline):
            return
        turns = iter(messages)
        answers: list[Any] = []

        async def one_at_a_time() -> None:
            """One of the window's GIVE_BACK_IN_FLIGHT: each call that ends lets the next one go, so one call held
            up (a hung broker) holds up no other (tests/unit/sdk/test_give_back_window.py::
            test_a_hung_async_give_back_call_holds_up_no_other), and each request is built as its turn comes, so
            the first calls go at once however many messages there are (::
            test_an_async_give_back_sends_its_first_calls_before_building_every_request)."""
            for message in turns:
                if deadline <= loop.time():
                    return
                try:
                    answers.append(await self._given_back_one(self._give_back_request(message), deadline))
                except (Exception, asyncio.CancelledError) as exc:  # a call the channel's close cancelled fails
                    if (task := asyncio.current_task()) is not None and task.cancelling():
                        raise
                    answers.append(exc)

        # Never raised out of an iteration's end or close().
        await asyncio.gather(*(one_at_a_time() for _ in range(min(GIVE_BACK_IN_FLIGHT, len(messages)))))
        log_give_back_failures(log, answers, len(messages))

    async def _given_back_undelivered(self, messages: list[Message], deadline: float) -> bool:
        """`_undelivered_requests` all at once, each on the stream or as a call (as `_given_back_one`); False when the
        proxy has no ChangeInvisibleMany (nothing was given back: the caller gives them back one by one)."""
        loop = asyncio.get_running_loop()

        async def one(request: Any) -> Any:
            try:
                response = await self._over_session("change_invisible_many", request, deadline - loop.time())
            except errors.Unavailable:
                if not self._closed or self._channel is None or deadline <= loop.time():
                    raise
                response = None
            if response is None:
                call = self._ext_stub.ChangeInvisibleMany(
                    request, timeout=deadline - loop.time(), metadata=self._metadata()
                )
                response = answered(await call)
            return response

        answers = await asyncio.gather(*map(one, self._undelivered_requests(messages)), return_exceptions=True)
        if any(isinstance(a, _waiting.KindUnknown) for a in answers):
            self._not_served("_many_served", "%s's Session takes no ChangeInvisibleMany: a change each")
            return False
        if any(
            isinstance(a, grpc.RpcError) and self._unimplemented(a, "_many_served", "ChangeInvisibleMany")
            for a in answers
        ):
            return False
        if any(not isinstance(a, BaseException) for a in answers):
            self._many_served = True
        log_give_back_failures(log, answers)
        return True

    async def _given_back_one(self, request: pb.ChangeInvisibleDurationRequest, deadline: float) -> Any:
        """One give-back by `deadline`: over the stream, or as a call once close() closed the stream under it (the
        call ends before the channel closes: `_session_closed` waits for it) —
        tests/unit/sdk/test_give_back.py::test_a_give_back_the_closing_stream_left_unanswered_goes_as_a_call."""
        loop = asyncio.get_running_loop()
        try:
            return await self._change_invisible(request, deadline - loop.time())
        except errors.Unavailable:
            if not self._closed or self._channel is None or (left := deadline - loop.time()) <= 0:
                raise
        call = self._stub.ChangeInvisibleDuration(request, timeout=left, metadata=self._metadata())
        return answered(await call)

    def _orphaned(self, messages: list[Any]) -> None:
        # Until the Session's close begins (it hands none after), close() included: close waits for these. The
        # give-back is the task itself (none started by another), which `_given_back` so sees from its start.
        if self._channel is None:  # closed (or never connected)
            return
        self._giving_back_task([_wire.from_v2(m) for m in messages])
        self._guard_loop_end(asyncio.get_running_loop())

    async def _change_invisible(
        self, request: pb.ChangeInvisibleDurationRequest, within_s: float
    ) -> pb.ChangeInvisibleDurationResponse:
        response = await self._over_session("change_invisible", request, within_s)
        if response is None:
            call = self._stub.ChangeInvisibleDuration(request, timeout=within_s, metadata=self._metadata())
            response = answered(await call)
        return response  # type: ignore[no-any-return]

    async def ack(self, message: Message, *, wait: bool = True) -> None:
        """Acknowledge one message; see `sdk.SimpleConsumer.ack`."""
        if not wait:
            await self.ack_many([message], wait=False)
            return
        failures = await self._ack(self._ack_plan([message]))
        if failures:
            raise failures[0][1]

    async def ack_many(self, messages: Iterable[Message], *, wait: bool = True) -> None:
        """Acknowledge many messages in batched calls; see `sdk.SimpleConsumer.ack_many`."""
        plan = self._ack_plan(messages)  # a bad argument raises here, to the caller, waiting or not
        if not wait:
            resend = functools.partial(self._ack, plan, resent=True)
            await self._unwaited.start(lambda: self._ack(plan), sum(len(r.entries) for r in plan), resend)
            await self._awaited_at_loop_end()
            return
        failures = await self._ack(plan)
        if failures:
            raise errors.AckError(failures)

    async def _ack(
        self, plan: list[pb.AckMessageRequest], *, resent: bool = False
    ) -> list[tuple[str, errors.PopgateError]]:
        """The ack calls of `plan`; `resent`: each a re-send of a call cut short (by the loop's end), over the unary
        RPC (that loop cancelled the Session stream), a stale handle counting as acked."""
        pending = [_resend.PendingAck(request) for request in plan]
        for one in pending:
            one.sent = int(resent)
        if len(pending) == 1:  # no task for the one call of most acks
            return await self._ack_request(pending[0], unary=resent)
        results = await asyncio.gather(*(self._ack_request(one, unary=resent) for one in pending))
        return [failure for chunk in results for failure in chunk]

    async def _ack_request(
        self, pending: _resend.PendingAck, *, unary: bool = False
    ) -> list[tuple[str, errors.PopgateError]]:
        async def op() -> list[tuple[str, errors.PopgateError]]:
            request = pending.next_request()
            timeout = self.options.request_timeout
            response = None if unary else await self._over_session("ack", request, timeout)
            if response is None:
                response = answered(await self._stub.AckMessage(request, timeout=timeout, metadata=self._metadata()))
            return pending.read(response)

        try:
            return await self._retrying(op, failed=pending.attempt_failed)
        except errors.PopgateError as exc:
            return pending.given_up(exc)

    async def nack(self, message: Message, delay: float = 0.0) -> Message:
        """Deliver the message again after ``delay`` seconds, replacing its handle; see `sdk.SimpleConsumer.nack`."""
        request = _wire.change_invisible_request(self.group, message, delay, namespace=self.options.namespace)
        attempts = itertools.count(1)

        async def op() -> str:
            resent = next(attempts) > 1
            response = await self._change_invisible(request, self.options.request_timeout)
            return _resend.new_handle(response, resent=resent)

        message.receipt_handle = await self._retrying(op)
        return message

    async def nack_many(self, messages: Iterable[Message], delay: float = 0.0) -> list[Message]:
        """Deliver many messages again after ``delay`` seconds, each with a new handle; see
        `sdk.SimpleConsumer.nack_many`."""
        listed = list(messages)
        plan = _nacks.plan(self.group, listed, delay, namespace=self.options.namespace)
        if len(plan) == 1:  # no task for the one request of most nack_many
            failures = await self._nack_request(plan[0])
        else:
            chunks = await asyncio.gather(*(self._nack_request(pending) for pending in plan))
            failures = [failure for chunk in chunks for failure in chunk]
        if failures:
            raise errors.NackError(failures)
        return listed

    async def _nack_request(self, pending: _nacks.PendingNack) -> _nacks.Failures:
        async def op() -> _nacks.Failures:
            return pending.read(await self._change_invisible_many(pending))

        try:
            return await self._retrying(op, failed=pending.attempt_failed)
        except errors.PopgateError as exc:
            return pending.given_up(exc)

    async def _change_invisible_many(self, pending: _nacks.PendingNack) -> _nacks.Outcome:
        """One attempt of the messages left: ChangeInvisibleMany on the Session stream or as a call, else (a proxy
        without it: nothing was served) a ChangeInvisibleDuration each, at once —
        tests/integration/sdk/test_nack_many.py::test_nack_many_against_a_proxy_without_it_nacks_each_message."""
        timeout = self.options.request_timeout
        if self._many_served is not False:
            request = pending.next_request()
            try:
                response = await self._over_session("change_invisible_many", request, timeout)
                if response is None:
                    call = self._ext_stub.ChangeInvisibleMany(request, timeout=timeout, metadata=self._metadata())
                    response = answered(await call)
                self._many_served = True
                return _nacks.outcome_of(response, len(request.entries))
            except _waiting.KindUnknown:
                self._not_served("_many_served", "%s's Session takes no ChangeInvisibleMany: a change each")
            except grpc.RpcError as exc:
                if not self._unimplemented(exc, "_many_served", "ChangeInvisibleMany"):
                    raise

        async def one(request: pb.ChangeInvisibleDurationRequest) -> str | errors.PopgateError:
            try:
                return _nacks.outcome_of_one(await self._change_invisible(request, timeout))
            except grpc.RpcError as exc:
                return convert(exc, tls=self.options.tls)
            except errors.PopgateError as exc:
                return exc

        return list(await asyncio.gather(*(one(request) for request in pending.single_requests())))

    async def forward_to_dlq(self, message: Message) -> None:
        """Move the message to ``%DLQ%<group>`` now; see `sdk.SimpleConsumer.forward_to_dlq`."""
        request = _wire.dlq_request(self.group, message, namespace=self.options.namespace)
        attempts = itertools.count(1)

        async def op() -> None:
            resent = next(attempts) > 1
            call = self._stub.ForwardMessageToDeadLetterQueue(
                request, timeout=self.options.request_timeout, metadata=self._metadata()
            )
            response = answered(await call)
            _resend.dead_lettered(response, resent=resent)

        await self._retrying(op)
