"""The admin service's broker-wait header (popgate_contract/admin_headers.py), read as the proxy reads it."""

from __future__ import annotations

import pytest

from popgate_contract.admin_headers import BROKER_TIMEOUT_HEADER, broker_timeout_header, broker_timeout_of


def test_a_wait_the_commands_send_is_read_back() -> None:
    assert broker_timeout_of(dict([broker_timeout_header(2.5)])) == 2.5
    assert broker_timeout_of(dict([broker_timeout_header(0.0001)])) == 0.001  # at least a millisecond
    assert broker_timeout_of({}) is None


@pytest.mark.parametrize(
    "value", ["0", "-5", "abc", " 5", "5.5", "600001", "9" * 5000, "\u00b2", "\u00b9\u00b2", "\u0661\u0662", ""]
)
def test_anything_else_is_the_proxys_own_wait_never_an_error(value: str) -> None:
    """Zero, past 10 minutes, not a number, or digits that are not ASCII (superscripts, which `str.isdigit` takes
    and `int` refuses; Arabic-Indic, which `int` reads): None, the proxy's --broker-timeout-s."""
    assert broker_timeout_of({BROKER_TIMEOUT_HEADER: value}) is None
