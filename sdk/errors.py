"""SDK errors: one base class, typed subclasses carrying the v2 ``code`` and a ``retriable`` flag.

Which code means what comes from the proxy's one table (`popgate_contract.codes.CODES`, domain
error -> v2 Code), read here in reverse: a code names the proxy's domain error, whose
class hierarchy picks the SDK class and whose ``retriable`` flag is kept. Codes that
table does not use (a RocketMQ proxy may send them) fall back to their hundred range,
as the official clients classify them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from popgate_pb.v2 import definition_pb2 as v2

from popgate_contract import errors as domain
from popgate_contract.codes import CODES

if TYPE_CHECKING:
    from .message import SendReceipt


class PopgateError(Exception):
    """Base of every error the SDK raises.

    Attributes:
        code: The apache.rocketmq.v2 ``Code`` from the server, or None for a transport error
            (connection refused, deadline exceeded) that carried no v2 status.
        code_name: The code's enum name (``"INVALID_RECEIPT_HANDLE"``) or the gRPC status name.
        retriable: True when the same call may succeed later unchanged (overload, failover).
        message: The server's message, or a description of the transport failure.
        receipts: Set when ``send_many`` fails: one entry per message given, in order: its
            `SendReceipt` when the server acknowledged storing it, else None (not sent, refused, or not
            known: a call cancelled on its way may have been stored). Resend the None entries' messages
            only; they may then be stored twice, as after any failed send. Also set when a request
            was partly stored (its messages' groups went to brokers apart and some failed): such an
            error is not retried by the SDK. None on other errors.
    """

    retriable: bool = False
    receipts: list[SendReceipt | None] | None = None

    def __init__(self, message: str, *, code: int | None = None, code_name: str = "", retriable: bool | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.code_name = code_name or (_code_name(code) if code is not None else "")
        if retriable is not None:
            self.retriable = retriable

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}" if self.code_name else self.message


class BadRequest(PopgateError):
    """The request was refused as malformed or out of range (v2 codes 400xx and 413xx)."""


class InvalidReceiptHandle(BadRequest):
    """The receipt handle is stale (redelivered or acked since), garbled or from an unknown broker."""


class MessageBodyTooLarge(BadRequest):
    """The message body exceeds the server's limit."""


class Unauthorized(PopgateError):
    """Credentials missing or wrong (401xx, 403xx)."""


class NotFound(PopgateError):
    """Topic or consumer group not found (404xx)."""


class TooManyRequests(PopgateError):
    """The server is overloaded; retry later (42900)."""

    retriable = True


class Unavailable(PopgateError):
    """No server or broker could serve the request right now (connection refused, broker failover)."""

    retriable = True


class Timeout(PopgateError):
    """The call did not finish in time (deadline exceeded or a proxy timeout)."""

    retriable = True


class ServerError(PopgateError):
    """The server failed while serving a valid request (500xx)."""


class Unsupported(PopgateError):
    """The server does not support this request or feature (501xx, 505xx)."""


class _Failed(PopgateError):
    """Some messages of a many-message call failed (`AckError`, `NackError`): ``failures`` and ``outcome_unknown``."""

    _done = "done"

    def __init__(self, failures: list[tuple[str, PopgateError]]) -> None:
        self.failures = failures
        self.outcome_unknown = [message_id for message_id, error in failures if isinstance(error, Timeout)]
        first = failures[0][1]
        unknown, done = len(self.outcome_unknown), self._done
        if not unknown:
            state = f"not {done}"
        elif unknown == len(failures):
            state = f"not known to be {done} (outcome unknown)"
        else:
            state = f"not {done} or not known to be ({unknown} outcome unknown)"
        super().__init__(
            f"{len(failures)} message(s) {state}; first: {first.message}",
            code=first.code,
            code_name=first.code_name,
            retriable=all(e.retriable for _, e in failures),
        )


class AckError(_Failed):
    """Some messages of an ``ack_many`` were not acked, or not known to be.

    A failure that is a `Timeout` (not retriable) has an unknown outcome: an attempt failed in a way that may
    have reached the broker (a timeout, a lost connection or answer) and no later answer said whether it was
    applied. Such a message may have been acked, and then never comes again; the others come again after
    their invisible time.

    Attributes:
        failures: ``(message_id, error)`` for every message that was not acked or not known to be.
        outcome_unknown: The message ids of ``failures`` whose outcome is unknown (their error is a `Timeout`).
    """

    _done = "acked"


class NackError(_Failed):
    """Some messages of a ``nack_many`` were not nacked, or not known to be; the others were (each has its new
    receipt handle).

    A failure that is a `Timeout` (not retriable) has an unknown outcome: the message may have been nacked, its new
    receipt handle lost with the answer (it comes again after the delay; its old handle no longer acks). The others
    keep their receipt handle and come again after their invisible time.

    Attributes:
        failures: ``(message_id, error)`` for every message that was not nacked or not known to be.
        outcome_unknown: The message ids of ``failures`` whose outcome is unknown (their error is a `Timeout`).
    """

    _done = "nacked"


class TransactionError(PopgateError):
    """Some half messages of a transaction were not committed (or rolled back); the others were. The transaction
    is over: what failed is left to the checker (docs/SDK.md, "Transactions, recall and priority"). A failure that
    is a `Timeout` has an unknown outcome: its commit or rollback may have been applied.

    Attributes:
        failures: ``(message_id, error)`` for every half message whose commit or rollback failed.
    """

    def __init__(self, failures: list[tuple[str, PopgateError]], *, commit: bool) -> None:
        self.failures = failures
        first = failures[0][1]
        named = "; ".join(f"{message_id}: {error.message}" for message_id, error in failures)
        done = "committed" if commit else "rolled back"
        unknown = sum(isinstance(error, Timeout) for _, error in failures)
        if not unknown:
            state = f"not {done}"
        elif unknown == len(failures):
            state = f"not known to be {done}"
        else:
            state = f"not {done} or not known to be"
        super().__init__(
            f"{len(failures)} message(s) of the transaction {state}: {named}",
            code=first.code,
            code_name=first.code_name,
            retriable=False,
        )


# SDK class for a proxy domain error: the first class of its MRO listed here.
_FAMILY: dict[type[domain.DomainError], type[PopgateError]] = {
    domain.InvalidReceiptHandle: InvalidReceiptHandle,
    domain.MessageBodyTooLarge: MessageBodyTooLarge,
    domain.BadRequest: BadRequest,
    domain.TopicNotFound: NotFound,
    domain.NotScheduled: NotFound,  # a recall of a message no longer waiting: v2 NOT_FOUND
    domain.Unauthorized: Unauthorized,
    domain.Forbidden: Unauthorized,
    domain.TooManyRequests: TooManyRequests,
    domain.BrokerTimeout: Timeout,
    domain.BrokerUnavailable: Unavailable,
    domain.ShuttingDown: Unavailable,
    domain.StoreUnavailable: Unavailable,
    domain.NotImplementedRpc: Unsupported,
    domain.Unsupported: Unsupported,
    domain.DomainError: ServerError,
}


def _reverse(table: dict[type[domain.DomainError], int]) -> dict[int, type[domain.DomainError]]:
    """code -> the most general domain error mapped to it (a parent wins over its subclasses)."""
    out: dict[int, type[domain.DomainError]] = {}
    for cls, code in table.items():
        current = out.get(code)
        if current is None or issubclass(current, cls):
            out[code] = cls
    return out


BY_CODE: dict[int, type[domain.DomainError]] = _reverse(CODES)

_RANGES: list[tuple[int, int, type[PopgateError]]] = [
    (40100, 40199, Unauthorized),
    (40300, 40399, Unauthorized),
    (40400, 40499, NotFound),
    (41300, 41399, BadRequest),
    (42900, 42999, TooManyRequests),
    (40000, 49999, BadRequest),
    (50100, 50199, Unsupported),
    (50400, 50499, Timeout),
    (50500, 50599, Unsupported),
    (50000, 59999, ServerError),
]


def _code_name(code: int) -> str:
    try:
        return v2.Code.Name(code)
    except ValueError:
        return str(code)


def error_for(code: int, message: str) -> PopgateError:
    """The typed error for a non-OK v2 status."""
    source = BY_CODE.get(code)
    if source is not None:
        family = next(_FAMILY[c] for c in source.__mro__ if c in _FAMILY)
        return family(message, code=code, retriable=source.retriable)
    for low, high, cls in _RANGES:
        if low <= code <= high:
            return cls(message, code=code)
    return ServerError(message, code=code)


# gRPC status name -> (SDK class, retriable) for calls that ended without a v2 status.
TRANSPORT: dict[str, type[PopgateError]] = {
    "UNAVAILABLE": Unavailable,
    "CANCELLED": Unavailable,  # the server cancelled the call (e.g. a proxy shutting down); ours is handled apart
    "ABORTED": Unavailable,
    "DEADLINE_EXCEEDED": Timeout,
    "RESOURCE_EXHAUSTED": MessageBodyTooLarge,  # a message over the gRPC limit (64 MiB, the client or the server)
    "UNIMPLEMENTED": Unsupported,
    "UNAUTHENTICATED": Unauthorized,
    "PERMISSION_DENIED": Unauthorized,
}


def transport_error(status_name: str, details: str) -> PopgateError:
    """The typed error for a gRPC call that failed below the v2 protocol. RESOURCE_EXHAUSTED is a message over
    gRPC's limit only when grpc says so ("... message larger than max ..."); otherwise the server's bound on calls
    at once ("Concurrent RPC limit exceeded!"), an overload to retry later —
    tests/unit/sdk/test_errors.py::test_a_server_out_of_calls_is_too_many_requests_not_a_message_too_large."""
    cls = TRANSPORT.get(status_name, ServerError)
    if cls is MessageBodyTooLarge and "larger than max" not in details:
        cls = TooManyRequests
    return cls(details or status_name, code_name=status_name)
