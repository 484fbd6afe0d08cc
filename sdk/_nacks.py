"""`nack_many` (sans-IO): the ChangeInvisibleMany requests of a consumer's messages, and each through its attempts.

A request names one topic and at most MAX_SEND_BATCH messages (the proxy's bound on entries), all made visible
again after the same delay. The proxy answers per entry: a message whose entry changed gets its new receipt handle
at once (its old one is stale from then on), one that failed retriably is sent again alone under the retry policy,
and one that failed for good is reported. As for `nack`, a re-sent entry answered with a stale handle is `Timeout`,
not retriable, outcome unknown: most likely an earlier attempt, whose answer was lost, changed it (docs/SDK.md,
"Errors and retries") — tests/unit/sdk/test_nack_many.py.
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
    """The requests that nack `messages`: one per topic and MAX_SEND_BATCH, each message once in order. A message
    without topic or receipt handle (never received), or a bad delay, is a ValueError here, before any is sent."""
    seconds = duration("delay", delay)
    chunks = _wire.received_chunks(messages, "nacked")
    return [PendingNack(group, topic, chunk, seconds, namespace) for topic, chunk in chunks]


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


class PendingNack:
    """One topic's chunk of a `nack_many` through its attempts: the messages left to change, and the failures."""

    def __init__(self, group: str, topic: str, messages: Sequence[Message], delay: float, namespace: str) -> None:
        self._base = ext.ChangeInvisibleMany()
        self._base.group.name = group
        self._base.topic.name = topic
        if namespace:
            self._base.group.resource_namespace = self._base.topic.resource_namespace = namespace
        _set_seconds(self._base.invisible_duration, delay)
        self._left = [(m, 0) for m in messages]  # each message not changed yet, and how often it was sent
        self._errors: list[errors.PopgateError | None] = [None] * len(messages)  # the last error of each one left
        self._final: Failures = []

    @property
    def left(self) -> list[Message]:
        return [m for m, _ in self._left]

    def next_request(self) -> ext.ChangeInvisibleMany:
        """The request of the messages left (one more attempt of each)."""
        self._left = [(m, sent + 1) for m, sent in self._left]
        request = ext.ChangeInvisibleMany()
        request.CopyFrom(self._base)
        add = request.entries.add
        for m, _ in self._left:
            entry = add()
            entry.message_id = m.message_id
            entry.receipt_handle = m.receipt_handle
        return request

    def not_served(self) -> None:
        """The last request was not served (the proxy has no ChangeInvisibleMany): it counts as no attempt."""
        self._left = [(m, sent - 1) for m, sent in self._left]

    def single_requests(self) -> list[pb.ChangeInvisibleDurationRequest]:
        """The messages left as one ChangeInvisibleDuration each (a proxy without ChangeInvisibleMany), as
        `next_request` counts an attempt of each."""
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
        retry: list[tuple[Message, int]] = []
        last: list[errors.PopgateError | None] = []
        for (message, sent), result in zip(self._left, outcome, strict=True):
            if isinstance(result, str):
                message.receipt_handle = result
                continue
            if sent > 1 and isinstance(result, errors.InvalidReceiptHandle):
                result = errors.Timeout(_resend.NACK_OUTCOME_UNKNOWN, retriable=False)
            if result.retriable:
                retry.append((message, sent))
                last.append(result)
            else:
                self._final.append((message.message_id, result))
        self._left, self._errors = retry, last
        if not retry:
            return self._final
        first = next(e for e in last if e is not None)
        raise _resend.ResendEntries(f"{len(retry)} nack entries failed ({first}); re-sending them", code=first.code)

    def given_up(self, error: errors.PopgateError) -> Failures:
        """What to report once the retries end with `error`: the failures so far and every message left, each with
        its entry's last error when an answer gave one, else `error` (the whole request failed)."""
        left = [
            (m.message_id, own if own is not None and isinstance(error, _resend.ResendEntries) else error)
            for (m, _), own in zip(self._left, self._errors, strict=True)
        ]
        return self._final + left
