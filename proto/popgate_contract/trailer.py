"""How a domain error crosses a broker call: a gRPC status code and the ``popgate-error`` trailer naming the class.

Both sides live here. A broker answers a `DomainError` with `status_of` its class and `trailer` (or, on the Session
stream, a ``SessionError`` with the same name and code); a proxy turns the failed call back into the very class
the broker raised with `error_of` (`from_broker` for a name), and a failure without a name it knows (none, or a
newer broker's) into the proxy's own errors by its gRPC code. Guarded by tests/unit/contract/test_trailer.py and
by the fuzz tests' check that every broker error carries a name.
"""

from __future__ import annotations

import grpc

from popgate_contract import errors

ERROR_KEY = "popgate-error"
UNSENT_KEY = "popgate-unsent"  # on a lost Session stream's error: this request was never written to it

# Domain error -> gRPC status code. The most specific class wins (checked via the MRO).
STATUS_OF: dict[type[errors.DomainError], grpc.StatusCode] = {
    errors.BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.TopicNotFound: grpc.StatusCode.NOT_FOUND,
    errors.TooManyRequests: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    # The proxy's admin service (proxy/admin.py) answers with this table too.
    errors.Unauthorized: grpc.StatusCode.UNAUTHENTICATED,
    errors.Forbidden: grpc.StatusCode.PERMISSION_DENIED,
    errors.BrokerUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.BrokerTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.DomainError: grpc.StatusCode.INTERNAL,
}
_BY_NAME: dict[str, type[errors.DomainError]] = {cls.__name__: cls for cls in errors.BROKER_ERRORS}
_CODES = {code.value[0]: code for code in grpc.StatusCode}


# -- the broker's side ------------------------------------------------------------------------------


def status_of(exc: errors.DomainError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


def trailer(exc: errors.DomainError) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that names `exc`'s class."""
    return ((ERROR_KEY, exc.name),)


def rpc_error(code: grpc.StatusCode, details: str, error: str = "", *, unsent: bool = False) -> grpc.aio.AioRpcError:
    """The error a unary call would raise: `code`, `details` and `error` (a class name) in the trailer."""
    pairs = [(ERROR_KEY, error)] if error else []
    if unsent:
        pairs.append((UNSENT_KEY, "1"))
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*pairs), details, None)


def session_error(error: str, message: str, grpc_code: int) -> grpc.aio.AioRpcError:
    """The unary call's error for a Session stream's ``SessionError`` answer."""
    return rpc_error(_CODES.get(grpc_code, grpc.StatusCode.UNKNOWN), message, error)


# -- the proxy's side -------------------------------------------------------------------------------


# grpc's words for a call that found no connection to its server (nothing listening): it never left.
NEVER_CONNECTED = "failed to connect to all addresses"


def unsent(error: grpc.aio.AioRpcError) -> bool:
    """Whether a Session request's error says it never left (safe to send again: it cannot apply twice)."""
    return any(key == UNSENT_KEY for key, _ in error.trailing_metadata() or ())


def from_broker(name: str, message: str, *, broker: str) -> errors.DomainError:
    """The error for a broker's domain error name (unknown names become BrokerFailure)."""
    cls = _BY_NAME.get(name)
    if cls is None:
        return errors.BrokerFailure(f"broker {broker}: {name or 'error'}: {message}")
    return cls(message)


def error_of(exc: grpc.aio.AioRpcError, broker: str) -> errors.DomainError:
    """The domain error for a failed broker call: the class its trailer names, else one for its gRPC code. A name
    this side does not know (a newer broker's error) is told by its code too, the name kept in the text, so that it is
    retried and failed over as its code says — tests/unit/contract/test_trailer.py::
    test_an_error_name_this_side_does_not_know_is_told_by_its_code_with_the_name_kept."""
    name = ""
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_KEY:
            name = value if isinstance(value, str) else value.decode()
    details = exc.details() or ""
    if name in _BY_NAME:
        return _BY_NAME[name](details)
    if name:
        details = f"{name}: {details}"
    code = exc.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        if unsent(exc):
            return errors.BrokerNotReached(f"broker {broker} is unavailable: {details}")
        return errors.BrokerUnavailable(f"broker {broker} is unavailable: {details}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.BrokerTimeout(f"broker {broker} did not answer in time")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "larger than max" in details:
            return errors.BrokerFailure(f"broker {broker}: a gRPC message exceeded the size limit: {details}")
        return errors.TooManyRequests(f"broker {broker} is overloaded: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return errors.BadRequest(f"broker {broker} refused the request: {details}")
    return errors.BrokerFailure(f"broker {broker} failed: {code.name}: {details}")
