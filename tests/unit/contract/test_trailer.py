"""The error trailer both ways: what a broker raises is what the proxy gets back, class and message."""

from __future__ import annotations

import grpc
import pytest

from popgate_contract import errors, trailer


@pytest.mark.parametrize("cls", errors.BROKER_ERRORS, ids=lambda c: c.__name__)
def test_a_broker_error_crosses_a_call_as_its_own_class(cls: type[errors.DomainError]) -> None:
    raised = cls("the broker's words")
    (key, name), *_ = trailer.trailer(raised)
    failed = trailer.rpc_error(trailer.status_of(raised), raised.message, name)
    got = trailer.error_of(failed, "b1")
    assert key == trailer.ERROR_KEY
    assert type(got) is cls and got.message == "the broker's words"


@pytest.mark.parametrize("cls", errors.BROKER_ERRORS, ids=lambda c: c.__name__)
def test_a_session_answer_names_the_same_class_as_a_unary_call(cls: type[errors.DomainError]) -> None:
    raised = cls("m")
    failed = trailer.session_error(raised.name, raised.message, trailer.status_of(raised).value[0])
    assert failed.code() == trailer.status_of(raised)
    assert type(trailer.error_of(failed, "b1")) is cls


def test_the_status_code_follows_the_most_specific_class() -> None:
    assert trailer.status_of(errors.IllegalTopic("m")) == grpc.StatusCode.INVALID_ARGUMENT
    assert trailer.status_of(errors.TooManyRequests("m")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert trailer.status_of(errors.DomainError("m")) == grpc.StatusCode.INTERNAL


def test_a_failure_without_a_name_is_told_by_its_code() -> None:
    def failed(code: grpc.StatusCode, details: str = "d", *, unsent: bool = False) -> errors.DomainError:
        return trailer.error_of(trailer.rpc_error(code, details, unsent=unsent), "b1")

    assert type(failed(grpc.StatusCode.UNAVAILABLE)) is errors.BrokerUnavailable
    assert type(failed(grpc.StatusCode.UNAVAILABLE, unsent=True)) is errors.BrokerNotReached
    assert type(failed(grpc.StatusCode.DEADLINE_EXCEEDED)) is errors.BrokerTimeout
    assert type(failed(grpc.StatusCode.RESOURCE_EXHAUSTED)) is errors.TooManyRequests
    assert type(failed(grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max (5 vs. 4)")) is errors.BrokerFailure
    assert type(failed(grpc.StatusCode.INVALID_ARGUMENT)) is errors.BadRequest
    assert "b1" in failed(grpc.StatusCode.INTERNAL, "boom").message


def test_an_unknown_name_or_the_bare_base_is_a_broker_failure() -> None:
    assert type(trailer.from_broker("Strange", "m", broker="b1")) is errors.BrokerFailure
    assert type(trailer.from_broker("DomainError", "m", broker="b1")) is errors.BrokerFailure
    assert type(trailer.from_broker("Unauthorized", "m", broker="b1")) is errors.BrokerFailure  # the proxy's own


def test_an_error_name_this_side_does_not_know_is_told_by_its_code_with_the_name_kept() -> None:
    """A newer broker's new error: retried and failed over as its gRPC code says, not an INTERNAL error."""

    def failed(name: str, code: grpc.StatusCode) -> errors.DomainError:
        return trailer.error_of(trailer.session_error(name, "refused", code.value[0]), "b1")

    unavailable = failed("BrokerUnavailable", grpc.StatusCode.UNAVAILABLE)  # the proxy's own name, not a broker's
    assert type(unavailable) is errors.BrokerUnavailable and unavailable.retriable
    assert "b1" in unavailable.message and "BrokerUnavailable: refused" in unavailable.message
    assert type(failed("QuotaExceeded", grpc.StatusCode.RESOURCE_EXHAUSTED)) is errors.TooManyRequests
    assert type(failed("QuotaExceeded", grpc.StatusCode.DEADLINE_EXCEEDED)) is errors.BrokerTimeout
    strange = failed("Strange", grpc.StatusCode.INTERNAL)
    assert type(strange) is errors.BrokerFailure and "Strange: refused" in strange.message
    assert type(failed("DomainError", grpc.StatusCode.INTERNAL)) is errors.BrokerFailure
    assert type(failed("TopicNotFound", grpc.StatusCode.UNAVAILABLE)) is errors.TopicNotFound  # a known name wins
