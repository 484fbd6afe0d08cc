"""Domain errors: the one vocabulary of broker, proxy and SDK. They know nothing of gRPC.

A broker names the class of the error it raises in the ``popgate-error`` trailer (`popgate_contract.trailer`);
the proxy raises that very class and tells a client its v2 code from the one table (`popgate_contract.codes`); the
SDK reads the code back into its own typed errors with the same table. `retriable` says whether trying the same
request again may succeed.
"""

from __future__ import annotations

# The words of a broker's TopicNotFound for a topic it is deleting (or whose deletion's rows are going): the proxy
# gives that reason, not "missing", when no broker took a send (proxy.sending).
BEING_DELETED = "is being deleted"


class DomainError(Exception):
    """Base of every error a popgate process reports to a caller; `name` is its class's name (the trailer's)."""

    retriable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def name(self) -> str:
        return type(self).__name__


class BadRequest(DomainError):
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


class InvalidRecallHandle(BadRequest):
    """A recall handle that is not one, or names another broker or topic, or another message."""


class InvalidTransactionId(BadRequest):
    """A transaction id that is not one, or names no half message waiting for its resolution (forged, or
    already committed, rolled back or checked out)."""


class NotScheduled(BadRequest):
    """A recall of a message that no longer waits for its time: delivered (or being delivered), or recalled."""


class TopicNotFound(DomainError):
    pass


class TooManyRequests(DomainError):
    """Overload: no room for one more long poll, or a queue is full."""

    retriable = True


class StoreUnavailable(DomainError):
    """The store refuses writes (disk full, read-only, closing)."""

    retriable = True


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


class Unauthorized(DomainError):
    """Missing or malformed credentials, unknown access key, bad signature or stale date (proxy/auth.py)."""


class Forbidden(DomainError):
    """Valid credentials without the permission (publish / subscribe / group) the request needs."""


class BrokerUnavailable(DomainError):
    """No live broker could serve the request (down, unreachable, failing health checks)."""

    retriable = True


class BrokerNotReached(BrokerUnavailable):
    """The request never left for the broker (its stream was lost, or could not connect, before it was written):
    trying it again cannot apply it twice."""


class BrokerTimeout(DomainError):
    """A broker did not answer within the deadline."""

    retriable = True


class BrokerFailure(DomainError):
    """A broker answered with an error the proxy has no better name for."""

    retriable = True


class NotImplementedRpc(DomainError):
    """An RPC of the protocol this proxy does not serve."""


class Unsupported(DomainError):
    """A feature of a served RPC this proxy does not support (e.g. SQL filters, transactions)."""


class ShuttingDown(DomainError):
    retriable = True


# What a broker may name in its trailer: the classes above the proxy's own (its finer message codes, its
# authentication and what goes wrong between proxy and broker). The bare base is an internal broker error.
BROKER_ERRORS: tuple[type[DomainError], ...] = (
    BadRequest,
    IllegalTopic,
    IllegalGroup,
    IllegalFilter,
    IllegalInvisibleTime,
    IllegalPollingTime,
    IllegalDeliveryTime,
    IllegalBatchSize,
    IllegalMessage,
    IllegalMessageKey,
    IllegalMessageGroup,
    IllegalPropertyKey,
    MessagePropertiesTooLarge,
    MessageBodyEmpty,
    MessageBodyTooLarge,
    InvalidReceiptHandle,
    InvalidRecallHandle,
    InvalidTransactionId,
    NotScheduled,
    TopicNotFound,
    TooManyRequests,
    StoreUnavailable,
)
