"""Broker domain errors. They know nothing of gRPC: the server maps them in one table."""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every error the broker reports to a caller."""

    retriable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def name(self) -> str:
        return type(self).__name__


class BadRequest(BrokerError):
    """A request field is out of range or malformed."""


class IllegalTopic(BadRequest):
    pass


class IllegalGroup(BadRequest):
    pass


class IllegalFilter(BadRequest):
    pass


class IllegalInvisibleTime(BadRequest):
    pass


class IllegalPollingTime(BadRequest):
    pass


class IllegalDeliveryTime(BadRequest):
    pass


class IllegalBatchSize(BadRequest):
    pass


class IllegalMessage(BadRequest):
    """Bad tag, key, property or message id."""


class MessageBodyEmpty(BadRequest):
    pass


class MessageBodyTooLarge(BadRequest):
    pass


class InvalidReceiptHandle(BadRequest):
    """Garbled, forged, stale (redelivered since) or already acked handle."""


class TopicNotFound(BrokerError):
    pass


class TooManyRequests(BrokerError):
    retriable = True


class StoreUnavailable(BrokerError):
    """The store refuses writes (disk full, read-only, closing)."""

    retriable = True
