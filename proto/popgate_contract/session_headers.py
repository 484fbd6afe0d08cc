"""The header by which popgate's proxy tells a client of its Session stream (proto/ext/messaging.proto) how many
messages one receive may ask: receives the client joined (sdk/_joining.py; the proxy's JOINED_RECEIVES in
proxy/v2/receive.py). A proxy without it takes receives of its max_batch, and the client joins none. And how many
requests the proxy keeps pending on one stream."""

from __future__ import annotations

from typing import Any

RECEIVE_BATCH_HEADER = "popgate-receive-batch"
# The requests popgate's proxy keeps pending on one Session stream (proxy/v2/session.py's MAX_PENDING), past which
# it answers TOO_MANY_REQUESTS: the client keeps no more than these pending on its stream (sdk/_room.py) —
# tests/unit/sdk/test_session_room.py::test_the_clients_bound_is_the_proxys.
MAX_PENDING_REQUESTS = 4096


def receive_batch_of(metadata: Any) -> int:
    """The largest joined receive the proxy takes, from the stream's headers (0: it joins none) —
    tests/unit/sdk/test_joined_receives.py::test_the_proxys_header_says_how_many_messages_a_receive_may_ask."""
    for key, value in metadata or ():
        if key == RECEIVE_BATCH_HEADER:
            text = value.decode() if isinstance(value, bytes) else value
            return int(text) if text.isdigit() else 0
    return 0
