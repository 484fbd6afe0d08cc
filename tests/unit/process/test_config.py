"""The servers' shared settings helpers (proto/popgate_process/config.py)."""

from __future__ import annotations

import socket

from popgate_process.config import cannot_listen


def test_a_port_in_use_is_told_in_the_systems_words() -> None:
    """grpc's own failure said only "Failed to bind ... set GRPC_VERBOSITY=debug", after a raw log line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        assert cannot_listen(address) == "Address already in use"
    assert cannot_listen(address) is None  # free again
