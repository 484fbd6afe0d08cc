"""Unit tests are pure: no network. A test here that binds or connects an IP socket fails (`make unit`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def refuse(name: str) -> Any:
        original = getattr(socket.socket, name)

        def guarded(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if self.family in (socket.AF_INET, socket.AF_INET6):
                raise AssertionError(f"a unit test must not {name} an IP socket: it belongs in tests/integration")
            return original(self, *args, **kwargs)

        return guarded

    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, refuse(name))
    yield
