"""Proxy domain errors. They know nothing of gRPC or of v2 codes: `proxy.codes` maps them in one table.

The errors a broker can report are the broker's own classes (`broker.errors`),
re-exported here: one vocabulary, so the ``popgate-error`` trailer a broker sends
names the very class the proxy raises (`from_broker`). `ProxyError` is their base,
`broker.errors.BrokerError`; the classes below it are the proxy's own: finer
message codes, authentication, and what can go wrong between proxy and broker.
"""

from __future__ import annotations

from broker import errors as _broker
from broker.errors import BadRequest as BadRequest
from broker.errors import BrokerError
from broker.errors import IllegalBatchSize as IllegalBatchSize
from broker.errors import IllegalDeliveryTime as IllegalDeliveryTime
from broker.errors import IllegalFilter as IllegalFilter
from broker.errors import IllegalGroup as IllegalGroup
from broker.errors import IllegalInvisibleTime as IllegalInvisibleTime
from broker.errors import IllegalMessage as IllegalMessage
from broker.errors import IllegalPollingTime as IllegalPollingTime
from broker.errors import IllegalTopic as IllegalTopic
from broker.errors import InvalidReceiptHandle as InvalidReceiptHandle
from broker.errors import MessageBodyEmpty as MessageBodyEmpty
from broker.errors import MessageBodyTooLarge as MessageBodyTooLarge
from broker.errors import StoreUnavailable as StoreUnavailable
from broker.errors import TooManyRequests as TooManyRequests
from broker.errors import TopicNotFound as TopicNotFound

ProxyError = BrokerError  # the base of both vocabularies: what a broker reports is what the proxy raises


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


class Unauthorized(ProxyError):
    """Missing or malformed credentials, unknown access key, bad signature or stale date (proxy/auth.py)."""


class Forbidden(ProxyError):
    """Valid credentials without the permission (publish / subscribe / group) the request needs."""


class BrokerUnavailable(ProxyError):
    """No live broker could serve the request (down, unreachable, failing health checks)."""

    retriable = True


class BrokerNotReached(BrokerUnavailable):
    """The request never left for the broker (its stream was lost, or could not connect, before it was written):
    trying it again cannot apply it twice."""


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


# Every error class a broker may name in its trailer, except the bare base (an internal broker error).
_BY_NAME: dict[str, type[ProxyError]] = {
    name: cls
    for name, cls in vars(_broker).items()
    if isinstance(cls, type) and issubclass(cls, ProxyError) and cls is not ProxyError
}


def from_broker(name: str, message: str, *, broker: str) -> ProxyError:
    """The error for a broker's domain error name (unknown names become BrokerFailure)."""
    cls = _BY_NAME.get(name)
    if cls is None:
        return BrokerFailure(f"broker {broker}: {name or 'error'}: {message}")
    return cls(message)
