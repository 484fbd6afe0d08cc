"""Clients in a forked child (docs/SDK.md, "Processes, threads and fork"), without sockets: a blocking client's
channel of its own. With a server: tests/integration/sdk/test_fork.py."""

from __future__ import annotations

import os

import pytest

from popgate import Producer, SimpleConsumer


def test_a_forked_childs_first_call_opens_a_channel_of_its_own_and_leaves_the_inherited_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parent = os.getpid()
    with Producer("127.0.0.1:1") as producer, SimpleConsumer("127.0.0.1:1", "g", "t") as consumer:
        inherited = [producer._channel, producer._send_shared, consumer._channel, consumer._stub, consumer._ext]
        closed: list[object] = []
        for channel in (inherited[0], inherited[2]):
            monkeypatch.setattr(channel, "close", lambda channel=channel: closed.append(channel))
        monkeypatch.setattr(os, "getpid", lambda: parent + 1)  # now in the child
        now = [producer._channel, producer._send_shared, consumer._channel, consumer._stub, consumer._ext]
        assert all(a is not b for a, b in zip(inherited, now, strict=True))
        assert producer._channel is now[0] and consumer._stub is now[3]  # once: later calls keep the new one
    assert closed == []  # closing in the child leaves grpc's inherited state alone (it closed the new channels)
