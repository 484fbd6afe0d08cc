"""Whether a server can listen on an address, asked of the system before grpc tries (popgate_process.config)."""

from __future__ import annotations

import socket

from popgate_process.config import cannot_listen


def test_a_port_in_use_is_told_in_the_systems_words() -> None:
    """Told in one line, as the system says it, not as grpc's bind failure and its log line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        assert cannot_listen(address) == "Address already in use"
    assert cannot_listen(address) is None  # free again
