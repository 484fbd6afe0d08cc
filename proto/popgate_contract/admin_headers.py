"""What a client of the proxy's admin service (popgate.admin.v1.Admin) may say beside its request: how long the
proxy is to wait for each broker (`popgate <command> --timeout`), in place of the proxy's --broker-timeout-s —
tests/integration/sdk/test_operate.py::test_dangerous_operations_need_confirmation_and_name_a_broker_down."""

from __future__ import annotations

from collections.abc import Mapping

BROKER_TIMEOUT_HEADER = "popgate-broker-timeout-ms"
MAX_BROKER_TIMEOUT_MS = 7 * 24 * 3600 * 1000  # as every other duration popgate takes


def broker_timeout_header(seconds: float) -> tuple[str, str]:
    return BROKER_TIMEOUT_HEADER, str(max(1, round(seconds * 1000)))


def broker_timeout_of(metadata: Mapping[str, str]) -> float | None:
    """The seconds the caller asked the proxy to wait for each broker, or None (not said, or not a number of
    milliseconds from 1 to MAX_BROKER_TIMEOUT_MS: the proxy's own then)."""
    text = metadata.get(BROKER_TIMEOUT_HEADER, "")
    if not text.isdigit() or not 1 <= int(text) <= MAX_BROKER_TIMEOUT_MS:
        return None
    return int(text) / 1000
