"""Dead letters: the message a delivery out of attempts becomes in `%DLQ%<group>`, and the log of those moved."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from google.protobuf.message import DecodeError
from popgate_pb import broker_pb2 as pb

from broker.inflight import GroupTopic
from popgate_contract import validation

log = logging.getLogger(__name__)
LOG_EVERY_S = 1.0  # dead letters are logged as one line per topic, group and attempt count at most this often


def letter_of(payload: bytes, state: GroupTopic, queue_id: int, offset: int, attempt: int) -> pb.Message:
    """The message to store in `%DLQ%<group>`: the original with its origin in properties. A stored payload that
    does not parse (the data file damaged under SQLite's notice) goes there as it is, as the body of a message
    marked UNREADABLE_PAYLOAD, rather than blocking its queue (a FIFO queue for good) or failing every Pop."""
    dlq = pb.Message()
    try:
        dlq.MergeFromString(payload)
    except DecodeError:
        log.error("%s/%s/%s: stored payload does not parse; dead-lettered as it is", state.topic, queue_id, offset)
        dlq.Clear()
        dlq.body = payload
        dlq.properties["UNREADABLE_PAYLOAD"] = "true"
    dlq.topic = validation.DLQ_PREFIX + state.group
    values = (state.topic, dlq.message_id, str(attempt), str(queue_id), str(offset))
    # A letter forwarded on from a DLQ keeps its first origin, so `popgate dlq resend` sends it back to its own topic
    # — test_dead_letter_stale.py::test_a_letter_forwarded_on_from_a_dlq_keeps_its_first_origin
    props = dict(zip(validation.DLQ_PROPS, values, strict=True))
    if state.topic.startswith(validation.DLQ_PREFIX) and "ORIGIN_TOPIC" in dlq.properties:
        props = {"DELIVERY_ATTEMPTS": props["DELIVERY_ATTEMPTS"]}  # this group's attempts, the first origin kept
    dlq.properties.update(props)
    return dlq


class MovedLog:
    """Dead letters moved, logged as one line per topic, group and attempt count at most every LOG_EVERY_S."""

    def __init__(self) -> None:
        self._moved: Counter[tuple[str, str, int]] = Counter()  # (topic, group, attempts): moved, not yet logged
        self._timer: asyncio.TimerHandle | None = None

    def moved(self, topic: str, group: str, attempts: int) -> None:
        self._moved[(topic, group, attempts)] += 1
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(LOG_EVERY_S, self.flush)

    def flush(self) -> None:
        """One line per topic, group and attempt count for the dead letters moved since the last one."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for (topic, group, attempts), count in self._moved.items():
            log.info(
                "dead-lettered %d message(s) of %s after %s attempts to %s",
                count,
                topic,
                attempts,
                validation.DLQ_PREFIX + group,
            )
        self._moved.clear()
