"""The headers by which popgate's proxy tells a client of its Session stream (proto/ext/messaging.proto) how many
messages one receive may ask: receives the client joined (sdk/_joining.py; the proxy's JOINED_RECEIVES in
proxy/v2/receive.py), a proxy without it taking receives of its max_batch and the client joining none; and the
largest stream message it reads (its max_message_bytes: a larger one would end the stream for every request on it).
And how many requests the proxy keeps pending on one stream."""

from __future__ import annotations

from typing import Any

RECEIVE_BATCH_HEADER = "popgate-receive-batch"
MAX_MESSAGE_HEADER = "popgate-max-message-bytes"
# The requests popgate's proxy keeps pending on one Session stream (proxy/v2/session.py's MAX_PENDING), past which
# it answers TOO_MANY_REQUESTS: the client keeps no more than these pending on its stream (sdk/_room.py) —
# tests/unit/sdk/test_session_room.py::test_the_clients_bound_is_the_proxys.
MAX_PENDING_REQUESTS = 4096


def receive_batch_of(metadata: Any) -> int:
    """The largest joined receive the proxy takes, from the stream's headers (0: it joins none) —
    tests/unit/sdk/test_joined_receives.py::test_the_proxys_header_says_how_many_messages_a_receive_may_ask."""
    return _number(metadata, RECEIVE_BATCH_HEADER)


def max_message_of(metadata: Any) -> int:
    """The largest stream message the proxy reads, from the stream's headers (0: it did not say) —
    tests/unit/sdk/test_session.py::test_a_request_past_the_proxys_message_limit_fails_alone_and_the_stream_goes_on."""
    return _number(metadata, MAX_MESSAGE_HEADER)


def _number(metadata: Any, key: str) -> int:
    for name, value in metadata or ():
        if name == key:
            text = value.decode() if isinstance(value, bytes) else value
            return int(text) if text.isdigit() else 0
    return 0
