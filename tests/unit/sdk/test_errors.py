"""The SDK's errors come from the proxy's one code table, read in reverse."""

from __future__ import annotations

import pytest
from popgate_pb.v2 import definition_pb2 as v2

from popgate import errors
from popgate_contract import errors as domain
from popgate_contract.codes import CODES


@pytest.mark.parametrize("cls", sorted(CODES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_every_code_the_proxy_sends_becomes_a_typed_error_with_its_retriable_flag(
    cls: type[domain.DomainError],
) -> None:
    code = CODES[cls]
    error = errors.error_for(code, "the server's words")
    assert isinstance(error, errors.PopgateError)
    assert error.code == code
    assert error.message == "the server's words"
    assert error.code_name == v2.Code.Name(code)
    source = errors.BY_CODE[code]
    assert error.retriable == source.retriable
    assert issubclass(cls, source) or CODES[source] == code  # the most general class of that code


def test_families_users_catch() -> None:
    assert type(errors.error_for(v2.INVALID_RECEIPT_HANDLE, "stale")) is errors.InvalidReceiptHandle
    assert type(errors.error_for(v2.ILLEGAL_TOPIC, "bad")) is errors.BadRequest
    assert type(errors.error_for(v2.MESSAGE_BODY_TOO_LARGE, "big")) is errors.MessageBodyTooLarge
    assert type(errors.error_for(v2.TOPIC_NOT_FOUND, "?")) is errors.NotFound
    too_many = errors.error_for(v2.TOO_MANY_REQUESTS, "slow down")
    assert isinstance(too_many, errors.TooManyRequests) and too_many.retriable
    failover = errors.error_for(v2.HA_NOT_AVAILABLE, "broker down")
    assert isinstance(failover, errors.Unavailable) and failover.retriable
    assert not errors.error_for(v2.INTERNAL_SERVER_ERROR, "bug").retriable
    assert str(errors.error_for(v2.INVALID_RECEIPT_HANDLE, "stale")) == "INVALID_RECEIPT_HANDLE: stale"


def test_codes_outside_the_table_fall_back_to_their_range() -> None:
    assert type(errors.error_for(v2.UNAUTHORIZED, "who?")) is errors.Unauthorized
    assert type(errors.error_for(v2.FORBIDDEN, "no")) is errors.Unauthorized
    assert type(errors.error_for(v2.CONSUMER_GROUP_NOT_FOUND, "no")) is errors.NotFound
    assert type(errors.error_for(v2.PROXY_TIMEOUT, "slow")) is errors.Timeout
    assert errors.error_for(v2.PROXY_TIMEOUT, "slow").retriable
    assert type(errors.error_for(v2.VERSION_UNSUPPORTED, "old")) is errors.Unsupported
    assert type(errors.error_for(12345, "odd")) is errors.ServerError


def test_transport_errors() -> None:
    unavailable = errors.transport_error("UNAVAILABLE", "connection refused")
    assert isinstance(unavailable, errors.Unavailable) and unavailable.retriable and unavailable.code is None
    assert isinstance(errors.transport_error("DEADLINE_EXCEEDED", ""), errors.Timeout)
    assert errors.transport_error("CANCELLED", "server shutting down").retriable
    assert not errors.transport_error("INTERNAL", "boom").retriable


def test_a_request_over_the_grpc_message_limit_is_a_body_too_large() -> None:
    too_large = errors.transport_error("RESOURCE_EXHAUSTED", "Sent message larger than max (70000100 vs. 67108864)")
    assert isinstance(too_large, errors.MessageBodyTooLarge) and not too_large.retriable
    assert (too_large.code, too_large.code_name) == (None, "RESOURCE_EXHAUSTED")


def test_a_server_out_of_calls_is_too_many_requests_not_a_message_too_large() -> None:
    """A server past its bound on calls at once (grpc's `maximum_concurrent_rpcs`, the proxy's own server alike)
    answers RESOURCE_EXHAUSTED too: an overload the SDK retries, not a message to make smaller."""
    busy = errors.transport_error("RESOURCE_EXHAUSTED", "Concurrent RPC limit exceeded!")
    assert isinstance(busy, errors.TooManyRequests) and busy.retriable
    assert busy.code_name == "RESOURCE_EXHAUSTED"
    received = errors.transport_error("RESOURCE_EXHAUSTED", "Received message larger than max (5 vs. 4)")
    assert isinstance(received, errors.MessageBodyTooLarge) and not received.retriable


def test_ack_error_lists_failures_and_is_retriable_only_if_all_are() -> None:
    stale = errors.error_for(v2.INVALID_RECEIPT_HANDLE, "stale")
    down = errors.error_for(v2.HA_NOT_AVAILABLE, "down")
    both = errors.AckError([("a", stale), ("b", down)])
    assert both.failures == [("a", stale), ("b", down)] and not both.retriable
    assert str(both) == "INVALID_RECEIPT_HANDLE: 2 message(s) not acked; first: stale"  # the code said once
    assert errors.AckError([("b", down)]).retriable
    refused = errors.Unavailable("connection refused", code_name="UNAVAILABLE")  # a transport error: no v2 code
    assert (errors.AckError([("c", refused)]).code, errors.AckError([("c", refused)]).code_name) == (
        None,
        "UNAVAILABLE",
    )
