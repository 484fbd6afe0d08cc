"""Re-sending ack, nack (ChangeInvisibleDuration), DLQ forwards and recalls after a retriable failure (sans-IO).

Re-sending one of these never applies it twice: each makes the message's receipt handle stale, and
the broker refuses a stale handle. So a re-send whose earlier attempt *did* apply (its answer lost to
a deadline or a dropped connection) is answered INVALID_RECEIPT_HANDLE. On a re-send, and only
there, the SDK reads that answer as "done by the earlier attempt":

* ack and forward_to_dlq succeed. Their only effect is to end this delivery; had the handle gone
  stale some other way (the message redelivered meanwhile), the message comes again, as it would
  after an error, so this reading loses no message.
* nack raises `Timeout` (not retriable, "outcome unknown"): its success needs the new handle, which
  only the lost answer carried. The message is delivered again after the delay; its old handle is dead.

A commit or rollback re-sent is answered OK while the broker remembers the resolution; one it no longer remembers
(restarted, or 4,096 resolutions since) is INVALID_TRANSACTION_ID: `Timeout` (not retriable, "outcome unknown").

A recall re-sent likewise finds its scheduled message gone (NOT_FOUND) when the earlier attempt withdrew it, and
also when it was delivered meanwhile: `Timeout` (not retriable, "outcome unknown"), not the NotFound that says it
was delivered.

An AckMessage answers per entry; entries that failed with a retriable error (broker failover,
overload) are re-sent alone, under the same retry policy as the whole call.

An ack entry that any attempt failed for with a `Timeout` or an `Unavailable` (the proxy answers HA_NOT_AVAILABLE
also for an ack it wrote to the broker and lost the answer to, docs/PROXY.md) may have been applied: if it is not
acked by the end, it is reported as a `Timeout`, not retriable, "ack outcome unknown", not as the last error, which
would say "not acked" of a message that may never come again. Only a connection that never opened says the
request never left —
tests/unit/sdk/test_acks.py::test_an_ack_applied_then_refused_on_every_retry_is_reported_outcome_unknown.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from . import _wire, errors

Failures = list[tuple[str, errors.PopgateError]]

NACK_OUTCOME_UNKNOWN = (
    "nack outcome unknown: an earlier attempt failed in a way that may have reached the broker, and the "
    "retry found the receipt handle already replaced (most likely by that attempt); the message will be "
    "delivered again after the delay, but its new receipt handle was lost and the old one no longer acks"
)


def _stale(status: v2.Status) -> bool:
    if status.code in _wire.SUCCESS:
        return False
    return isinstance(errors.error_for(status.code, status.message), errors.InvalidReceiptHandle)


def new_handle(response: pb.ChangeInvisibleDurationResponse, *, resent: bool) -> str:
    """The receipt handle a ChangeInvisibleDuration answered; see the module docstring for ``resent``."""
    if resent and _stale(response.status):
        raise errors.Timeout(NACK_OUTCOME_UNKNOWN, retriable=False)
    _wire.check(response.status)
    return str(response.receipt_handle)


def dead_lettered(response: pb.ForwardMessageToDeadLetterQueueResponse, *, resent: bool) -> None:
    """Check a ForwardMessageToDeadLetterQueue answer; a stale handle on a re-send means forwarded."""
    if not (resent and _stale(response.status)):
        _wire.check(response.status)


RECALL_OUTCOME_UNKNOWN = (
    "recall outcome unknown: an earlier attempt failed in a way that may have reached the broker, and the retry "
    "found the scheduled message gone: withdrawn by that attempt, or delivered meanwhile"
)


def recalled(response: pb.RecallMessageResponse, *, resent: bool) -> str:
    """The recalled message's id; see the module docstring for ``resent`` —
    tests/unit/sdk/test_resend.py::test_a_recall_resent_after_a_lost_answer_is_outcome_unknown_not_not_found."""
    if resent and response.status.code not in _wire.SUCCESS:
        error = errors.error_for(response.status.code, response.status.message)
        if isinstance(error, errors.NotFound):
            raise errors.Timeout(RECALL_OUTCOME_UNKNOWN, retriable=False)
    _wire.check(response.status)
    return str(response.message_id)


TRANSACTION_OUTCOME_UNKNOWN = (
    "{what} outcome unknown: an earlier attempt failed in a way that may have reached the broker, and the retry "
    "found the transaction resolved already, by that attempt or by a check, the broker no longer knowing which way "
    "({answer})"
)


def transaction_ended(response: pb.EndTransactionResponse, *, resent: bool, commit: bool | None) -> None:
    """Check an EndTransaction answer. On a re-send, INVALID_TRANSACTION_ID (the broker has no such half message: it
    answers the same resolution sent again OK only while it remembers it) is `Timeout`, not retriable, outcome
    unknown: the earlier attempt may have applied it —
    tests/unit/sdk/test_resend.py::test_a_commit_resent_after_a_lost_answer_and_refused_is_outcome_unknown_not_not_committed."""
    if resent and response.status.code == v2.INVALID_TRANSACTION_ID:
        what = "commit" if commit else "rollback" if commit is False else "check answer"
        answer = response.status.message
        raise errors.Timeout(TRANSACTION_OUTCOME_UNKNOWN.format(what=what, answer=answer), retriable=False)
    _wire.check(response.status)


ACK_OUTCOME_UNKNOWN = (
    "ack outcome unknown: an attempt failed in a way that may have reached the broker and applied it, and no "
    "later answer said whether it did (last: {last}); the message comes again after its invisible time, unless "
    "it was acked"
)
NEVER_CONNECTED = "failed to connect to all addresses"  # grpc's UNAVAILABLE for a call that never left
# Said by an attempt that left nothing on its way: a Session request that timed out before it was written
# (sdk/_session.py), a call the closed channel refused (`client_closed`).
NOT_SENT = "nothing was sent"


def client_closed(*, sent: bool = False) -> errors.Unavailable:
    """A call's error once its client is closed: one close() cut short on its way may have been applied (`sent`);
    one made after it was never sent, and says so (`maybe_applied`) — tests/unit/sdk/test_acks.py::
    test_an_ack_after_close_is_unavailable_and_not_outcome_unknown."""
    return errors.Unavailable("the client is closed" if sent else f"the client is closed: {NOT_SENT}", retriable=False)


def after_maybe_applied(error: errors.PopgateError) -> errors.PopgateError:
    """`error` of an attempt that sent nothing, raised for a call an earlier attempt of which may have been applied:
    the call as a whole may have been, so it no longer says that nothing was sent — tests/unit/sdk/test_acks.py::
    test_a_nack_applied_then_refused_by_the_closed_channel_is_not_said_to_have_sent_nothing."""
    if NOT_SENT not in error.message:
        return error
    out = copy.copy(error)
    out.message = error.message.replace(f": {NOT_SENT}", " (an earlier attempt may have been applied)")
    out.args = (out.message,)
    return out


def maybe_applied(error: errors.PopgateError) -> bool:
    """Whether an attempt that failed with `error` may have reached the broker (see the module docstring)."""
    return (
        isinstance(error, (errors.Timeout, errors.Unavailable))
        and NEVER_CONNECTED not in error.message
        and NOT_SENT not in error.message
    )


class ResendEntries(errors.PopgateError):
    """Some ack entries failed with retriable errors: the retry loop sends them again (never raised to users)."""

    retriable = True


class PendingAck:
    """One AckMessage request through its attempts: what is left to send and what failed for good."""

    def __init__(self, request: pb.AckMessageRequest) -> None:
        self.request = request
        self.sent = 0
        self._final: Failures = []
        self._retry: Failures = []
        self._unknown: set[str] = set()  # message ids an attempt may have acked (`maybe_applied`)

    @property
    def failures(self) -> Failures:
        """``(message_id, error)`` of every entry not acked (so far), those maybe acked as outcome unknown."""
        return [(message_id, self._outcome(message_id, error)) for message_id, error in self._final + self._retry]

    def _outcome(self, message_id: str, error: errors.PopgateError) -> errors.PopgateError:
        if message_id not in self._unknown:
            return error
        return errors.Timeout(ACK_OUTCOME_UNKNOWN.format(last=error), retriable=False)

    def attempt_failed(self, error: errors.PopgateError) -> None:
        """Record an attempt that failed as a whole (no answer, or one for the whole call) with `error`."""
        if maybe_applied(error):
            self._unknown.update(entry.message_id for entry in self.request.entries)

    def given_up(self, error: errors.PopgateError) -> Failures:
        """What to report once the retries end with ``error``: the entries not acked, when some answer
        said which (also when a later re-send of them failed as a whole); else every entry of the request,
        with ``error`` (the whole call failed: one topic's call must not hide the others' outcomes)."""
        if isinstance(error, ResendEntries) or self.failures:
            return self.failures
        return [(entry.message_id, self._outcome(entry.message_id, error)) for entry in self.request.entries]

    def next_request(self) -> pb.AckMessageRequest:
        self.sent += 1
        return self.request

    def read(self, response: pb.AckMessageResponse) -> Failures:
        """Record an answer to the last request and return `failures` when nothing is left to re-send.

        Raises:
            ResendEntries: Entries failed retriably; the request now holds only those.
            PopgateError: The whole call failed (it is re-sent unchanged if the error is retriable).
        """
        failed = _wire.ack_failures(response)  # raises when the whole call failed
        if not failed:
            self._retry = []
            return self.failures
        retry: Failures = []
        entries: list[pb.AckMessageEntry] = []
        matcher = _Entries(self.request.entries)
        for (message_id, error), result in zip(failed, _failed_results(response), strict=True):
            if self.sent > 1 and isinstance(error, errors.InvalidReceiptHandle):
                continue  # acked by an earlier attempt whose answer was lost
            if maybe_applied(error):
                self._unknown.add(message_id)
            entry = matcher.take(result)
            if error.retriable and entry is not None:
                retry.append((message_id, error))
                entries.append(entry)
            else:
                self._final.append((message_id, error))
        self._retry = retry
        if not retry:
            return self.failures
        narrowed = pb.AckMessageRequest()
        narrowed.CopyFrom(self.request)
        del narrowed.entries[:]
        narrowed.entries.extend(entries)
        self.request = narrowed
        first = retry[0][1]
        raise ResendEntries(f"{len(retry)} ack entries failed ({first}); re-sending them", code=first.code)


def _failed_results(response: pb.AckMessageResponse) -> list[pb.AckMessageResultEntry]:
    """The result entries `_wire.ack_failures` reports, in its order."""
    if response.status.code == v2.OK:
        return []
    return [e for e in response.entries if e.HasField("status") and e.status.code != v2.OK]


class _Entries:
    """Finds the request entry a result entry answers: by receipt handle when echoed, else by message id."""

    def __init__(self, entries: Sequence[pb.AckMessageEntry]) -> None:
        self._left = list(entries)

    def take(self, result: pb.AckMessageResultEntry) -> pb.AckMessageEntry | None:
        for key in ("receipt_handle", "message_id"):
            wanted = getattr(result, key)
            if not wanted:
                continue
            for i, entry in enumerate(self._left):
                if getattr(entry, key) == wanted:
                    return self._left.pop(i)
        return None
