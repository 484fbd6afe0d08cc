"""The header by which a broker says the name it runs under (its --name) in the initial metadata of its health
checks' answers: the name it writes into every receipt handle, and so the only one under which a proxy may route to
it (proxy.brokers.GrpcBrokerClient.check_health). An older broker does not say it."""

from __future__ import annotations

from typing import Any

NAME_KEY = "popgate-broker-name"


def name_said(metadata: Any) -> str | None:
    """The broker's own name from an answer's metadata; None when it does not say it —
    tests/unit/proxy/test_broker_names.py."""
    for key, value in metadata or ():
        if key == NAME_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None
