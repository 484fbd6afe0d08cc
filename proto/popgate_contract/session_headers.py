"""The header by which popgate's proxy tells a client of its Session stream (proto/ext/messaging.proto) how many
messages one receive may ask: receives the client joined (sdk/_joining.py; the proxy's JOINED_RECEIVES in
proxy/v2/receive.py). A proxy without it takes receives of its max_batch, and the client joins none."""

from __future__ import annotations

from typing import Any

RECEIVE_BATCH_HEADER = "popgate-receive-batch"


def receive_batch_of(metadata: Any) -> int:
    """The largest joined receive the proxy takes, from the stream's headers (0: it joins none) —
    tests/unit/sdk/test_joined_receives.py::test_the_proxys_header_says_how_many_messages_a_receive_may_ask."""
    for key, value in metadata or ():
        if key == RECEIVE_BATCH_HEADER:
            text = value.decode() if isinstance(value, bytes) else value
            return int(text) if text.isdigit() else 0
    return 0
