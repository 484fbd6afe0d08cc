"""What the SDK hands to and gets from users: messages and send receipts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Message:
    """A message, to send or as received.

    To send, give ``body`` and any of ``tag``, ``keys``, ``properties``, ``message_group``,
    ``deliver_at``, ``priority`` (see `Producer.send_many`). A received message also carries the fields
    the server filled in; ``receipt_handle`` is what `SimpleConsumer.ack` needs, and it
    changes when the message is nacked.

    Attributes:
        body: Payload bytes.
        topic: The topic it was sent to.
        tag: Optional tag (consumers can filter on it).
        keys: Optional business keys.
        properties: User properties (string to string).
        message_group: FIFO message group, if any.
        deliver_at: Scheduled delivery time, seconds since the epoch, if any.
        priority: Priority (>= 0; higher is delivered first among a queue's ready messages), if any.
        message_id: Id given by the producer.
        attempt: Delivery attempt, 1 on first delivery.
        born_at: When the producer created it, seconds since the epoch.
        stored_at: When the broker stored it, seconds since the epoch.
        receipt_handle: Opaque handle for ack / nack / forward_to_dlq.
        queue_id: Queue on its broker.
        offset: Offset in that queue.
        born_host: The host its producer ran on, as that client said (a received message's).
    """

    body: bytes
    topic: str = ""
    tag: str | None = None
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    message_group: str | None = None
    deliver_at: float | None = None
    priority: int | None = None
    message_id: str = ""
    attempt: int = 0
    born_at: float = 0.0
    stored_at: float = 0.0
    receipt_handle: str = ""
    queue_id: int = -1
    offset: int = -1
    born_host: str = ""

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded as text (invalid bytes replaced).

        Args:
            encoding: The body's text encoding.
        """
        return self.body.decode(encoding, errors="replace")


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """The server's answer for one sent message.

    Attributes:
        message_id: The message's id (consumers see the same id).
        topic: The topic it was stored in.
        offset: Its offset in the queue that stored it; -1 for a scheduled message (delay / deliver_at),
            whose offset is assigned when it comes due, and for a transaction's message.
        recall_handle: A scheduled message's handle for `Producer.recall`; empty for any other.
        transaction_id: A transaction's message's id (`Producer.transaction`); empty for any other.
    """

    message_id: str
    topic: str
    offset: int
    recall_handle: str = ""
    transaction_id: str = ""
