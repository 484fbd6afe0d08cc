"""Proxy domain errors. They know nothing of gRPC or of v2 codes: `proxy.codes` maps them in one table.

Class names that match a broker error name (``popgate-error`` trailer) are the
same concept; `from_broker` turns a broker's error name into the class here.
"""

from __future__ import annotations


class ProxyError(Exception):
    """Base of every error the proxy reports to a client."""

    retriable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def name(self) -> str:
        return type(self).__name__


class BadRequest(ProxyError):
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
    """Bad message id or another message field without a more precise code."""


class IllegalMessageTag(IllegalMessage):
    pass


class IllegalMessageKey(IllegalMessage):
    pass


class IllegalMessageGroup(IllegalMessage):
    pass


class IllegalPropertyKey(IllegalMessage):
    pass


class MessagePropertiesTooLarge(IllegalMessage):
    pass


class MessageBodyEmpty(BadRequest):
    pass


class MessageBodyTooLarge(BadRequest):
    pass


class InvalidReceiptHandle(BadRequest):
    """Garbled, forged, stale or already acked handle, or one naming a broker we do not know."""


class TopicNotFound(ProxyError):
    pass


class Unauthorized(ProxyError):
    """Missing or malformed credentials, unknown access key, bad signature or stale date (proxy/auth.py)."""


class Forbidden(ProxyError):
    """Valid credentials without the permission (publish / subscribe / group) the request needs."""


class TooManyRequests(ProxyError):
    """Overload: the broker could not hold one more long poll, or a queue is full."""

    retriable = True


class StoreUnavailable(ProxyError):
    """The broker's store refuses writes (disk full, read-only, closing)."""

    retriable = True


class BrokerUnavailable(ProxyError):
    """No live broker could serve the request (down, unreachable, failing health checks)."""

    retriable = True


class BrokerTimeout(ProxyError):
    """A broker did not answer within the deadline."""

    retriable = True


class BrokerFailure(ProxyError):
    """A broker answered with an error the proxy has no better name for."""

    retriable = True


class NotImplementedRpc(ProxyError):
    """An RPC of the protocol this proxy does not serve."""


class Unsupported(ProxyError):
    """A feature of a served RPC this proxy does not support (e.g. SQL filters, transactions)."""


class ShuttingDown(ProxyError):
    retriable = True


_BY_NAME: dict[str, type[ProxyError]] = {
    cls.__name__: cls
    for cls in (
        BadRequest,
        IllegalTopic,
        IllegalGroup,
        IllegalFilter,
        IllegalInvisibleTime,
        IllegalPollingTime,
        IllegalDeliveryTime,
        IllegalBatchSize,
        IllegalMessage,
        MessageBodyEmpty,
        MessageBodyTooLarge,
        InvalidReceiptHandle,
        TopicNotFound,
        TooManyRequests,
        StoreUnavailable,
    )
}


def from_broker(name: str, message: str, *, broker: str) -> ProxyError:
    """The proxy error for a broker's domain error name (unknown names become BrokerFailure)."""
    cls = _BY_NAME.get(name)
    if cls is None:
        return BrokerFailure(f"broker {broker}: {name or 'error'}: {message}")
    return cls(message)
