"""The one table: proxy domain error -> apache.rocketmq.v2 Code.

Lookup walks the class hierarchy, so a subclass without its own row gets its
parent's code. Anything that is not a DomainError is an internal error.
"""

from __future__ import annotations

from popgate_pb.v2 import definition_pb2 as v2

from popgate_contract import errors

Code = v2.Code

CODES: dict[type[errors.DomainError], int] = {
    errors.DomainError: Code.INTERNAL_SERVER_ERROR,
    errors.BadRequest: Code.BAD_REQUEST,
    errors.IllegalTopic: Code.ILLEGAL_TOPIC,
    errors.IllegalGroup: Code.ILLEGAL_CONSUMER_GROUP,
    errors.IllegalFilter: Code.ILLEGAL_FILTER_EXPRESSION,
    errors.IllegalInvisibleTime: Code.ILLEGAL_INVISIBLE_TIME,
    errors.IllegalPollingTime: Code.ILLEGAL_POLLING_TIME,
    errors.IllegalDeliveryTime: Code.ILLEGAL_DELIVERY_TIME,
    errors.IllegalBatchSize: Code.BAD_REQUEST,
    errors.IllegalMessage: Code.ILLEGAL_MESSAGE_ID,
    errors.IllegalMessageTag: Code.ILLEGAL_MESSAGE_TAG,
    errors.IllegalMessageKey: Code.ILLEGAL_MESSAGE_KEY,
    errors.IllegalMessageGroup: Code.ILLEGAL_MESSAGE_GROUP,
    errors.IllegalPropertyKey: Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
    errors.MessagePropertiesTooLarge: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    errors.MessageBodyEmpty: Code.MESSAGE_BODY_EMPTY,
    errors.MessageBodyTooLarge: Code.MESSAGE_BODY_TOO_LARGE,
    errors.InvalidReceiptHandle: Code.INVALID_RECEIPT_HANDLE,
    errors.InvalidRecallHandle: Code.BAD_REQUEST,
    errors.InvalidTransactionId: Code.INVALID_TRANSACTION_ID,
    errors.NotScheduled: Code.NOT_FOUND,  # not MESSAGE_NOT_FOUND: official clients take that for success
    errors.TopicNotFound: Code.TOPIC_NOT_FOUND,
    errors.TooManyRequests: Code.TOO_MANY_REQUESTS,
    errors.Unauthorized: Code.UNAUTHORIZED,
    errors.Forbidden: Code.FORBIDDEN,
    errors.StoreUnavailable: Code.MASTER_PERSISTENCE_TIMEOUT,
    errors.BrokerUnavailable: Code.HA_NOT_AVAILABLE,
    errors.BrokerNotReached: Code.HA_NOT_AVAILABLE,  # never left for the broker: the proxy may retry it
    errors.BrokerTimeout: Code.PROXY_TIMEOUT,
    errors.BrokerFailure: Code.INTERNAL_SERVER_ERROR,
    errors.NotImplementedRpc: Code.NOT_IMPLEMENTED,
    errors.Unsupported: Code.UNSUPPORTED,
    errors.ShuttingDown: Code.HA_NOT_AVAILABLE,
}


def code_of(error: BaseException) -> int:
    """The v2 Code for an error raised while serving a request."""
    if isinstance(error, errors.DomainError):
        for cls in type(error).__mro__:
            code = CODES.get(cls)
            if code is not None:
                return code
    return Code.INTERNAL_SERVER_ERROR


def status_of(error: errors.DomainError) -> v2.Status:
    """The v2 Status that tells a client of `error`: its code from the table, its own message."""
    return v2.Status(code=code_of(error), message=error.message)  # type: ignore[arg-type]


def name_of(code: int) -> str:
    """The Code's enum name, e.g. 'INVALID_RECEIPT_HANDLE' (the number as text when unknown)."""
    try:
        return v2.Code.Name(code)
    except ValueError:
        return str(code)
