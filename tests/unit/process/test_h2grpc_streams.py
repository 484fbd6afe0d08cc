"""How popgate's h2 connection keeps count of a connection's streams (popgate_process.h2grpc.h2conn), without
sockets: an h2 client's bytes are fed to the server's connection object directly."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from popgate_process.h2grpc.h2conn import H2Connection

HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/apache.rocketmq.v2.MessagingService/SendMessage"),
    (":authority", "127.0.0.1"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def server_and_client() -> tuple[H2Connection, h2.connection.H2Connection]:
    server = H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.local_settings = h2.settings.Settings(
        client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1 << 20}
    )
    server.initiate_connection()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    return server, client


def opened(server: H2Connection, client: h2.connection.H2Connection, count: int) -> list[int]:
    """`count` new calls' HEADERS, each fed to the server alone (as they would arrive one by one)."""
    ids = []
    for _ in range(count):
        stream_id = client.get_next_available_stream_id()
        client.send_headers(stream_id, HEADERS)
        events = server.receive_data(client.data_to_send())
        assert any(isinstance(e, h2.events.RequestReceived) for e in events)
        ids.append(stream_id)
    return ids


def test_opening_calls_costs_the_same_however_many_are_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """With thousands of calls open on one connection, each new one looks at a bounded number of streams on
    average (h2's own count looks at every stream the connection holds at each new one), and closed calls are let
    go as calls go on."""
    looked_at = 0
    walk = h2.connection.H2Connection._open_streams

    def counted(self: Any, remainder: int) -> int:
        nonlocal looked_at
        if isinstance(self, H2Connection):  # the server's (the test's client walks its own)
            looked_at += len(self.streams)
        return walk(self, remainder)

    monkeypatch.setattr(h2.connection.H2Connection, "_open_streams", counted)
    server, client = server_and_client()
    first = opened(server, client, 3000)
    assert looked_at < 10 * 3000  # h2's walk at each: ~4.5 million
    for stream_id in first:  # every one of them ends (the client cancels it)
        client.reset_stream(stream_id)
    server.receive_data(client.data_to_send())
    opened(server, client, 3000)
    assert len(server.streams) <= 2 * 3000 + 64  # the 3,000 ended ones pruned
    assert server.open_inbound_streams == 3000
