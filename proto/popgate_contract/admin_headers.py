"""What a client of the proxy's admin service (popgate.admin.v1.Admin) may say beside its request: how long the
proxy is to wait for each broker (`popgate <command> --timeout`), in place of the proxy's --broker-timeout-s —
tests/integration/sdk/test_operate.py::test_dangerous_operations_need_confirmation_and_name_a_broker_down."""

from __future__ import annotations

import re
from collections.abc import Mapping

BROKER_TIMEOUT_HEADER = "popgate-broker-timeout-ms"
_MILLISECONDS = re.compile(r"[0-9]{1,9}")
# A caller may make the proxy wait longer than its --broker-timeout-s for each broker (a large topic's deletion),
# up to this: an admin call does not hold a proxy's task and broker calls for longer, deadline or not.
MAX_BROKER_TIMEOUT_MS = 600_000


def broker_timeout_header(seconds: float) -> tuple[str, str]:
    return BROKER_TIMEOUT_HEADER, str(max(1, round(seconds * 1000)))


def broker_timeout_of(metadata: Mapping[str, str]) -> float | None:
    """The seconds the caller asked the proxy to wait for each broker, or None (not said, or not a number of
    milliseconds from 1 to MAX_BROKER_TIMEOUT_MS in ASCII digits: the proxy's own then) —
    tests/unit/contract/test_admin_headers.py."""
    text = metadata.get(BROKER_TIMEOUT_HEADER, "")
    if not _MILLISECONDS.fullmatch(text) or not 1 <= int(text) <= MAX_BROKER_TIMEOUT_MS:  # ASCII digits only
        return None
    return int(text) / 1000
