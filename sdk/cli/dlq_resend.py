"""`popgate dlq resend`: the dead letters of ``%DLQ%<group>`` sent back to their ORIGIN_TOPIC through the proxy.

It consumes the DLQ with its own consumer group (`DLQ_RESEND_GROUP`, so each letter is re-sent once), acks what it
re-sent, and leaves in the DLQ a letter it cannot re-send (no ORIGIN_TOPIC, or a send refused for good), naming it
on stderr. Whatever a run received and did not re-send is given back when it ends, so the next run sees it at once.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from popgate_contract.validation import DLQ_PREFIX, RESERVED_PROPERTY_KEYS, has_control

from .. import errors
from ..client import Producer, SimpleConsumer
from ..message import Message
from .admin import err
from .commands import IdleWait
from .options import check_listening, connection
from .output import error_console, explain, msg_rate, progress

GIVE_BACK_AT_ONCE = 32  # give-back calls in flight at a time (a run's batch)
# A send refused for this letter, not for the run: another letter (another topic, another body) may go.
REFUSED_FOR_GOOD = (errors.NotFound, errors.BadRequest, errors.Unauthorized)


@dataclass
class LeftLetters:
    """The dead letters a run left in the DLQ: why each was left (the first reason, in the order met) and the
    latest delivery of each, to give back when the run ends: its id, topic and receipt handle only, not its body
    or properties — test_dlq_commands.py::test_a_left_letter_is_kept_without_its_body_until_given_back."""

    reasons: dict[str, str] = field(default_factory=dict)  # message id -> why it was left
    held: dict[str, Message] = field(default_factory=dict)  # message id -> its latest delivery, not given back

    def leave(self, message: Message, why: str) -> None:
        self.reasons.setdefault(message.message_id, why)  # once, also when it comes back within the run
        # An earlier delivery's handle is stale by now: the latest one's replaces it.
        self.held[message.message_id] = Message(
            b"", topic=message.topic, message_id=message.message_id, receipt_handle=message.receipt_handle
        )

    def lines(self, topic: str) -> list[str]:
        """One line per reason, naming its letters."""
        by_reason: dict[str, list[str]] = defaultdict(list)
        for message_id, why in self.reasons.items():
            by_reason[why].append(message_id)
        return [f"{len(ids)} dead letter(s) left in {topic}, {why}: {', '.join(ids)}" for why, ids in by_reason.items()]


def resent(message: Message) -> tuple[str, Message] | None:
    """The original topic and the message to send there (its tag, keys, message group and priority kept; DLQ
    bookkeeping properties removed, and those a send is refused for since a dead letter stored before the checks
    may carry them: a reserved name or a control character — test_dlq_commands.py::
    test_a_dead_letter_stored_before_the_property_checks_is_resent_without_what_they_refuse);
    None when the dead letter does not name its original topic (it cannot be re-sent)."""
    origin = message.properties.get("ORIGIN_TOPIC", "")
    if not origin:
        return None
    properties = {
        k: v
        for k, v in message.properties.items()
        if k not in RESERVED_PROPERTY_KEYS and not has_control(k) and not has_control(v)
    }
    return origin, Message(
        message.body,
        tag=message.tag,
        keys=message.keys,
        properties=properties,
        message_group=message.message_group,
        priority=message.priority,
    )


def dlq_resend_command(args: argparse.Namespace) -> int:
    topic = DLQ_PREFIX + args.group
    counts: dict[str, int] = defaultdict(int)
    options = connection(args)
    left = LeftLetters()
    code = 0
    console = error_console()
    try:
        with (
            SimpleConsumer(args.endpoint, args.resend_group, {topic: "*"}, **options) as consumer,
            Producer(args.endpoint, **options) as producer,
        ):
            check_listening(args.endpoint)
            with progress(console, quiet=args.quiet) as bar:
                task = bar.add_task(f"resend {topic}", total=args.count or None, rate="")
                started = time.perf_counter()

                def advance(n: int) -> None:
                    done = sum(counts.values())
                    bar.update(task, advance=n, rate=msg_rate(done, time.perf_counter() - started))

                _resend(consumer, producer, args, topic, counts, left, advance)
    except errors.PopgateError as exc:
        err(f"popgate dlq resend: {explain(exc)}")
        code = 1
    except KeyboardInterrupt:  # the summary of what was re-sent so far, then 130
        code = 130
    where = ", ".join(f"{n} to {t}" for t, n in sorted(counts.items())) or "nothing to resend"
    if not args.quiet and code != 1:
        err(f"resent {sum(counts.values())} message(s) from {topic}: {where}{' (interrupted)' if code else ''}")
    for line in left.lines(topic):
        err(f"popgate dlq resend: {line}")
    return code or (1 if left.reasons else 0)


def _resend(
    consumer: SimpleConsumer,
    producer: Producer,
    args: argparse.Namespace,
    topic: str,
    counts: dict[str, int],
    left: LeftLetters,
    advance: Callable[[int], None],
) -> None:
    """Re-send dead letters to their ORIGIN_TOPIC and ack them, until --count or idle for --wait. A letter without
    ORIGIN_TOPIC, or whose send is refused for good (its topic gone, not allowed, the message refused), is left in
    the DLQ (not acked) and put in `left`; the others go on. When the run ends, those left and, if it stopped on an
    error or Ctrl-C, the rest of its batch are given back (visible at once) — test_dlq_commands.py::
    test_dlq_resend_gives_back_what_it_did_not_resend_when_a_send_stops_it."""
    try:
        _resend_batches(consumer, producer, args, counts, left, advance)
    finally:
        _give_back(consumer, left.held.values())
        left.held.clear()


def _resend_batches(
    consumer: SimpleConsumer,
    producer: Producer,
    args: argparse.Namespace,
    counts: dict[str, int],
    left: LeftLetters,
    advance: Callable[[int], None],
) -> None:
    idle = IdleWait(args.wait)
    total = 0
    while (args.count == 0 or total < args.count) and (wait := idle.next()) is not None:
        want = 32 if args.count == 0 else min(32, args.count - total)
        try:
            batch = consumer.receive(max=want, wait=wait)
        except errors.NotFound as exc:
            # Brokers without --auto-create make %DLQ%<group> with its first letter: none yet is nothing to
            # resend, as `dlq list` counts 0 — test_operate.py::
            # test_dlq_resend_of_a_group_without_dead_letters_on_production_brokers_resends_nothing
            if exc.code_name != "TOPIC_NOT_FOUND":
                raise
            return
        outcome = Outcome()
        try:
            _resend_batch(producer, batch, outcome)
        finally:  # those re-sent are acked also when a send fails or Ctrl-C stops the batch: not re-sent again
            for index in sorted(outcome.left):  # named in the order received, as each was met
                left.leave(batch[index], outcome.left[index])
            for origin in outcome.sent.values():
                counts[origin] += 1
            done = [batch[index] for index in sorted(outcome.sent)]
            try:
                if done:
                    consumer.ack_many(done)
            finally:  # received and not tried: the next run sees them at once
                _give_back(
                    consumer, [m for i, m in enumerate(batch) if i not in outcome.sent and i not in outcome.left]
                )
        if done:  # a batch of dead letters left before is not progress: the wait goes on
            idle.received()
            total += len(done)
            advance(len(done))


@dataclass
class Outcome:
    """What became of a batch's letters so far, by their index in it: re-sent (to which topic) or left (why)."""

    sent: dict[int, str] = field(default_factory=dict)
    left: dict[int, str] = field(default_factory=dict)


def _resend_batch(producer: Producer, batch: list[Message], outcome: Outcome) -> None:
    """Re-send a batch's letters with one send_many per origin topic, in the batch's order (a message group's
    letters stay in order) — test_dlq_commands.py::
    test_dlq_resend_sends_the_letters_of_one_origin_topic_in_one_send_many. A send failing for another reason than
    the letter (the proxy gone, a timeout) raises: the run stops."""
    by_origin: dict[str, list[tuple[int, Message]]] = defaultdict(list)
    for index, message in enumerate(batch):
        plan = resent(message)
        if plan is None:
            outcome.left[index] = "without ORIGIN_TOPIC"
        else:
            by_origin[plan[0]].append((index, plan[1]))
    for origin, letters in by_origin.items():
        _resend_to(producer, origin, letters, outcome)


def _resend_to(producer: Producer, origin: str, letters: list[tuple[int, Message]], outcome: Outcome) -> None:
    """Send `letters` (their index in the batch, the message to send) to `origin`, putting in `outcome` those
    stored, also when it raises. A send_many refused for good sends those it did not store one at a time, so that
    the letter refused is left and the others are re-sent — test_dlq_commands.py::
    test_dlq_resend_sends_one_by_one_the_letters_of_a_send_many_refused_for_good."""
    try:
        producer.send_many(origin, [message for _, message in letters])
    except errors.PopgateError as exc:
        receipts = exc.receipts or [None] * len(letters)
        rest = []
        for (index, message), receipt in zip(letters, receipts, strict=True):
            if receipt is None:
                rest.append((index, message))
            else:
                outcome.sent[index] = origin
        if not isinstance(exc, REFUSED_FOR_GOOD):
            raise
        if len(letters) == 1:  # the letter's own send
            outcome.left[letters[0][0]] = f"to {origin}: {explain(exc)}"
            return
        for index, message in rest:
            try:
                producer.send(origin, message)
            except REFUSED_FOR_GOOD as refused:
                outcome.left[index] = f"to {origin}: {explain(refused)}"
                continue
            outcome.sent[index] = origin
        return
    outcome.sent.update((index, origin) for index, _ in letters)


def _give_back(consumer: SimpleConsumer, messages: Iterable[Message]) -> None:
    """Make `messages` visible again at once (a nack with no delay), `GIVE_BACK_AT_ONCE` at a time, each call one
    attempt of at most 1 s as the SDK's own give-backs. Best effort: a handle that went stale is a letter delivered
    again already; once a call does not reach the proxy (gone, timed out) the rest are left, as they come back
    after their invisible time anyway, so that a failure here neither hides the one that stopped the run nor
    delays it — test_dlq_commands.py::test_dlq_resend_stops_giving_back_at_the_first_call_the_proxy_does_not_answer."""
    left = list(messages)
    for start in range(0, len(left), GIVE_BACK_AT_ONCE):
        if not consumer._give_back(left[start : start + GIVE_BACK_AT_ONCE]):
            return
