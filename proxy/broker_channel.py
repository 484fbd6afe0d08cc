"""A broker client's gRPC channel, and whether anything listens at a broker's address (`proxy.brokers`)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from popgate_contract.broker_token import client_interceptors
from popgate_contract.validation import parse_host_port
from proxy.settings import BrokerAddress


def open_channel(address: BrokerAddress, *, token: str = "", tls_ca: bytes | None = None) -> grpc.aio.Channel:
    """The channel of one broker client. `tls_ca`: PEM CA bundle: the channel is TLS and the broker's certificate
    must name `address.host_name` (or the target's host) — tests/integration/proxy/test_broker_tls.py."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        # Reconnect quickly to a restarted broker (the default back-off grows to minutes). Not
        # grpc.min_reconnect_backoff_ms: it is also the time a connection attempt gets (see sdk/_transport.py).
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 1000),
        # Its own connection: a client made again for a stuck connection (proxy.health) gets a new one, not the
        # old one from grpc's process-wide pool — tests/integration/proxy/test_silent_link.py.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    interceptors = client_interceptors(token) or None
    if tls_ca is None:
        return grpc.aio.insecure_channel(address.target, options=options, interceptors=interceptors)
    if address.host_name:
        options.append(("grpc.ssl_target_name_override", address.host_name))
    credentials = grpc.ssl_channel_credentials(root_certificates=tls_ca)
    return grpc.aio.secure_channel(address.target, credentials, options=options, interceptors=interceptors)


async def listening(address: BrokerAddress, within_s: float) -> bool:
    """Whether something accepts a TCP connection at the broker's address now (closed at once). The channel
    cannot say: while its reconnect back-off runs it fails calls without trying."""
    host, port = parse_host_port(address.target, what=f"broker {address.name}")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), within_s)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def reconnected(channel: grpc.aio.Channel, within_s: float) -> bool:
    """Whether `channel` connects within `within_s`."""
    try:
        await asyncio.wait_for(channel.channel_ready(), within_s)
    except TimeoutError:
        return False
    return True
