"""Domain errors: the vocabulary the broker and the proxy share. They know nothing of gRPC.

The broker's server maps them to gRPC codes in one table and names them in the
``popgate-error`` trailer; the proxy raises these same classes (`proxy.errors`
re-exports them beside its own) and maps them to v2 codes in `proxy.codes`.
"""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every error the broker reports to a caller (the proxy's `ProxyError` is this class)."""

    retriable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def name(self) -> str:
        return type(self).__name__


class BadRequest(BrokerError):
    """A request field is missing, out of range or malformed."""


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
    """Bad tag, key, property or message id (the proxy has more precise subclasses for some)."""


class MessageBodyEmpty(BadRequest):
    pass


class MessageBodyTooLarge(BadRequest):
    pass


class InvalidReceiptHandle(BadRequest):
    """Garbled, forged, stale (redelivered since) or already acked handle, or one naming an unknown broker."""


class TopicNotFound(BrokerError):
    pass


class TooManyRequests(BrokerError):
    """Overload: no room for one more long poll, or a queue is full."""

    retriable = True


class StoreUnavailable(BrokerError):
    """The store refuses writes (disk full, read-only, closing)."""

    retriable = True
