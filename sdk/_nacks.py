"""`nack_many` (sans-IO): the ChangeInvisibleMany requests of a consumer's messages, and each through its attempts.

A request names one topic and at most MAX_SEND_BATCH receipt handles (the proxy's bound on entries), all made
visible again after the same delay. The proxy answers per entry: a message whose entry changed gets its new receipt
handle at once (its old one is stale from then on), one that failed retriably is sent again alone under the retry
policy, and one that failed for good is reported. Once an attempt may have reached the broker without its answer
coming back (a timeout, a lost connection), any later failure of its entries — a stale handle most of all, which
that attempt most likely made so — is `Timeout`, not retriable, outcome unknown, as for `ack_many` (docs/SDK.md,
"Errors and retries") — tests/unit/sdk/test_nack_many.py. A receipt handle given twice is sent once and its new
handle given to each of its messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import service_pb2 as pb

from . import _resend, _wire, errors
from ._durations import _set_seconds, duration
from .message import Message

Failures = list[tuple[str, errors.PopgateError]]
# Per message of a request, in order: its new receipt handle, or why it was not changed.
Outcome = list[str | errors.PopgateError]


def plan(group: str, messages: Sequence[Message], delay: float, *, namespace: str = "") -> list[PendingNack]:
    """The requests that nack `messages`: one per topic and MAX_SEND_BATCH receipt handles, each handle once in the
    order it first comes, however often and in whichever chunk its messages come —
    tests/unit/sdk/test_nack_many.py::test_a_handle_given_twice_far_apart_is_sent_in_one_request_only. A message
    without topic or receipt handle (never received), or a bad delay, is a ValueError here, before any is sent."""
    seconds = duration("delay", delay)
    copies: dict[tuple[str, str], list[Message]] = {}
    for m in messages:
        copies.setdefault((m.topic, m.receipt_handle), []).append(m)
    firsts = [listed[0] for listed in copies.values()]
    chunks = _wire.received_chunks(firsts, "nacked")
    return [
        PendingNack(group, topic, [copies[m.topic, m.receipt_handle] for m in chunk], seconds, namespace)
        for topic, chunk in chunks
    ]


def outcome_of(response: ext.ChangeInvisibleManyResponse, count: int) -> Outcome:
    """Each entry's new handle or error; the whole request's error is raised (retried when retriable)."""
    entries = response.entries
    if len(entries) != count:
        _wire.check(response.status)
        raise errors.ServerError(f"ChangeInvisibleMany answered {len(entries)} entries for {count}")
    ok = _wire.SUCCESS
    return [
        e.receipt_handle if e.status.code in ok else errors.error_for(e.status.code, e.status.message) for e in entries
    ]


def outcome_of_one(response: pb.ChangeInvisibleDurationResponse) -> str | errors.PopgateError:
    """A ChangeInvisibleDuration's answer as an entry's outcome (a proxy without ChangeInvisibleMany)."""
    status = response.status
    if status.code in _wire.SUCCESS:
        return str(response.receipt_handle)
    return errors.error_for(status.code, status.message)


NACK_MAYBE_APPLIED = (
    "nack outcome unknown: an attempt failed in a way that may have reached the broker and applied it, and no "
    "later answer said whether it did (last: {last}); if it did, the message comes again after the delay and its "
    "old receipt handle no longer acks"
)


class _Entry:
    """A receipt handle of the request and the messages carrying it (the same message may be given twice)."""

    __slots__ = ("messages", "maybe_applied", "error")

    def __init__(self, messages: list[Message]) -> None:
        self.messages = messages
        self.maybe_applied = False  # an attempt failed in a way that may have changed it (`_resend.maybe_applied`)
        self.error: errors.PopgateError | None = None  # its last error, when an answer gave one

    def failure(self, error: errors.PopgateError) -> list[tuple[str, errors.PopgateError]]:
        """`error` for each of its messages; outcome unknown once an attempt may have changed it —
        tests/unit/sdk/test_nack_many.py::test_a_timed_out_attempt_makes_what_fails_after_it_outcome_unknown."""
        if self.maybe_applied and (error.retriable or not isinstance(error, errors.Timeout)):
            error = errors.Timeout(NACK_MAYBE_APPLIED.format(last=error), retriable=False)
        return [(m.message_id, error) for m in self.messages]


class PendingNack:
    """One topic's chunk of a `nack_many` through its attempts: the receipt handles left to change, each once
    however often its message was given (`copies`: the messages of each handle), and the failures."""

    def __init__(self, group: str, topic: str, copies: list[list[Message]], delay: float, namespace: str) -> None:
        self._base = ext.ChangeInvisibleMany()
        self._base.group.name = group
        self._base.topic.name = topic
        if namespace:
            self._base.group.resource_namespace = self._base.topic.resource_namespace = namespace
        _set_seconds(self._base.invisible_duration, delay)
        self._left = [_Entry(messages) for messages in copies]  # each handle not changed yet
        self._final: Failures = []

    @property
    def left(self) -> list[Message]:
        return [m for e in self._left for m in e.messages]

    def next_request(self) -> ext.ChangeInvisibleMany:
        """The request of the handles left (one more attempt of each)."""
        request = ext.ChangeInvisibleMany()
        request.CopyFrom(self._base)
        add = request.entries.add
        for e in self._left:
            entry = add()
            entry.message_id = e.messages[0].message_id
            entry.receipt_handle = e.messages[0].receipt_handle
        return request

    def attempt_failed(self, error: errors.PopgateError) -> None:
        """Record an attempt that failed as a whole (no answer, or one for the whole call) with `error`."""
        if _resend.maybe_applied(error):
            for e in self._left:
                e.maybe_applied = True

    def single_requests(self) -> list[pb.ChangeInvisibleDurationRequest]:
        """The handles left as one ChangeInvisibleDuration each (a proxy without ChangeInvisibleMany)."""
        many = self.next_request()
        return [
            pb.ChangeInvisibleDurationRequest(
                group=many.group,
                topic=many.topic,
                receipt_handle=e.receipt_handle,
                message_id=e.message_id,
                invisible_duration=many.invisible_duration,
            )
            for e in many.entries
        ]

    def read(self, outcome: Outcome) -> Failures:
        """Record the outcome of the last request's entries; `failures` once nothing is left to send again.

        Raises:
            _resend.ResendEntries: Entries failed retriably: the next request holds only those.
        """
        retry: list[_Entry] = []
        first: errors.PopgateError | None = None
        for e, result in zip(self._left, outcome, strict=True):
            if isinstance(result, str):
                for m in e.messages:
                    m.receipt_handle = result
                continue
            if e.maybe_applied and isinstance(result, errors.InvalidReceiptHandle):
                result = errors.Timeout(_resend.NACK_OUTCOME_UNKNOWN, retriable=False)
            e.maybe_applied = e.maybe_applied or _resend.maybe_applied(result)
            if result.retriable:
                e.error = result
                first = first or result
                retry.append(e)
            else:
                self._final += e.failure(result)
        self._left = retry
        if first is None:
            return self._final
        raise _resend.ResendEntries(f"{len(retry)} nack entries failed ({first}); re-sending them", code=first.code)

    def given_up(self, error: errors.PopgateError) -> Failures:
        """What to report once the retries end with `error`: the failures so far and every message left, each with
        its entry's last error when an answer gave one, else `error` (the whole request failed)."""
        resent = isinstance(error, _resend.ResendEntries)
        left = [f for e in self._left for f in e.failure(e.error if resent and e.error is not None else error)]
        return self._final + left
