"""What both clients share about gRPC: connection options, channel credentials, error conversion."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from popgate_contract.validation import parse_host_port

from . import errors
from ._durations import duration
from ._ids import new_client_id
from ._metadata import CallMetadata, Credentials
from .retry import RetryPolicy

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # the gRPC message limit, both ways (a larger request: MessageBodyTooLarge)

# Reconnect quickly after a proxy restart (gRPC's default back-off grows to two minutes). Not
# grpc.min_reconnect_backoff_ms: grpc core takes it as the minimum time a connection attempt gets (default 20 s),
# which a slow handshake needs (tests/integration/sdk/test_connect.py, the SDK reaching a slow proxy).
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # gRPC's transparent retry only (no retry policy is configured: the SDK's own `RetryPolicy` retries): a call
    # that never reached the server, opened on a connection as its GOAWAY came or as it closed, goes on a new one —
    # tests/integration/sdk/test_connection_age.py. It costs nothing measurable (bench.ratios, session 46).
    ("grpc.enable_retries", 1),
    ("grpc.keepalive_time_ms", 30_000),
    # The largest HTTP/2 DATA frame the server may send (the default is 16 KiB): a receive's answer then goes as one
    # frame, not one per 16 KiB, each of which popgate's proxy frames in Python (docs/BENCHMARKS.md).
    ("grpc.http2.max_frame_size", 1 << 20),
]


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Connection options common to Producer and SimpleConsumer (see their docstrings)."""

    endpoint: str
    credentials: Credentials | None = None
    tls: bool = False
    root_certificates: bytes | None = None
    namespace: str = ""
    request_timeout: float = 3.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def metadata(self) -> CallMetadata:
        return CallMetadata(client_id=new_client_id, namespace=self.namespace, credentials=self.credentials)


_NAMESPACE = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # as the proxy checks it (proxy.validate): refused here alike


def make_options(
    endpoint: str,
    *,
    access_key: str | None,
    secret_key: str | None,
    tls: bool | str | Path,
    namespace: str,
    request_timeout: float,
    retry: RetryPolicy | None,
) -> ClientOptions:
    try:
        host, port = parse_host_port(endpoint, what="endpoint")  # a port past 65535 would wrap round
    except ValueError as exc:  # the servers' parser allows port 0 (listen anywhere): a client's endpoint does not
        raise ValueError(str(exc).replace("a port is 0..65535", "a port is 1..65535")) from None
    if ";" in endpoint or "," in endpoint:  # the official clients' list syntax: "host1:port;host2:port"
        raise ValueError(
            f"endpoint {endpoint!r}: one proxy address HOST:PORT (put a load balancer in front of several)"
        )
    if port == 0 or not host or any(c.isspace() for c in endpoint):
        raise ValueError(f"endpoint {endpoint!r} is not HOST:PORT (a port is 1..65535, no spaces)")
    if (access_key is None) != (secret_key is None):
        raise ValueError("give access_key and secret_key together")
    if namespace and not _NAMESPACE.fullmatch(namespace):  # a header value: else grpc's "Invalid metadata" at a call
        raise ValueError(f"namespace {namespace!r}: 1..64 of a-z, A-Z, 0-9, '_' and '-' (or none)")
    # Bounded, so a call's gRPC timeout (request_timeout, + wait for a receive) stays far from grpc's deadline overflow.
    duration("request_timeout", request_timeout, positive=True)
    if retry is not None and not isinstance(retry, RetryPolicy):  # else an AttributeError at the first call
        raise TypeError(f"retry must be a RetryPolicy, got {type(retry).__name__}: {retry!r}")
    roots = None
    if isinstance(tls, str) and not tls.strip():  # neither a path nor a yes or no: refused, whatever it was meant as
        raise ValueError(
            f"tls={tls!r}: give a CA certificate file, or True for the system's roots, False for plaintext"
        )
    if isinstance(tls, str | Path):
        roots = Path(tls).read_bytes()
        if b"-----BEGIN CERTIFICATE-----" not in roots:  # else gRPC retries a failing handshake for seconds
            raise ValueError(f"tls={tls}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it")
    return ClientOptions(
        endpoint=endpoint,
        credentials=Credentials(access_key, secret_key) if access_key is not None and secret_key is not None else None,
        tls=bool(tls),
        root_certificates=roots,
        namespace=namespace,
        request_timeout=request_timeout,
        retry=retry or RetryPolicy(),
    )


def channel_credentials(options: ClientOptions) -> grpc.ChannelCredentials | None:
    if not options.tls:
        return None
    return grpc.ssl_channel_credentials(root_certificates=options.root_certificates)


TLS_HINT = " (is the server using TLS? connect with tls=True, or tls=<its CA certificate file>)"
NOT_GRPC_HINT = " (the server at this address does not speak gRPC: is it the popgate proxy's port?)"
CERT_HINT = " (the server's certificate does not verify: pass tls=<the CA certificate file that signed it>)"
HOSTNAME_HINT = " (the server's certificate is for another name: connect with a host name it names)"
PLAINTEXT_HINT = " (the server does not use TLS: connect without tls)"
NO_CONNECTION_HINT = (
    " (the server did not answer in time: no connection was made; is it overloaded, out of file descriptors or"
    " unreachable?)"
)
NO_ANSWER_HINT = (
    " (the server accepted the connection but did not answer in time: is it overloaded, out of file descriptors or"
    " stopped?)"
)
# What grpc says when its connect timeout ends an attempt: no TCP connection; no HTTP/2 SETTINGS; no TLS answer.
_NO_CONNECTION = ("tcp handshaker shutdown", "connect() timed out")
_NO_ANSWER = ("timed out before receiving SETTINGS frame", "Handshake read failed (Endpoint closing)")
# What a plaintext client of a TLS server gets: the server closes (or resets) the connection at the HTTP/2 preface.
_CLOSED = ("Socket closed", "Connection reset by peer")


def convert(exc: grpc.RpcError, *, tls: bool) -> errors.PopgateError:
    """A failed gRPC call as the SDK's typed error; `tls`: whether the channel uses TLS.

    A TLS server closes a plaintext connection, which gRPC reports only as "failed to connect to all
    addresses; ... Socket closed" (or a reset): a plaintext client's error then says the server may be using TLS.
    Nothing else does: a refused connection (nothing listening) gets no hint, nor does an UNAVAILABLE the server
    answered with; a connection attempt that timed out (a server out of descriptors, overloaded or stopped) says the
    server did not answer in time —
    tests/unit/sdk/test_commands.py::test_a_connection_attempt_that_timed_out_says_the_server_did_not_answer_in_time;
    a server that answers in something other than HTTP/2 (a web server) is said not to be a gRPC one. A server
    certificate that does not verify is not retriable: every retry would fail the same way for seconds."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else str(exc)) or ""
    name = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
    if "Failed parsing HTTP/2" in details:  # it answered, but not in HTTP/2: a web server, not a gRPC one
        details += NOT_GRPC_HINT
    elif tls and "CERTIFICATE_VERIFY_FAILED" in details:  # the same certificate fails again: not retried
        return errors.Unavailable(details + CERT_HINT, code_name=name, retriable=False)
    elif tls and "Hostname Verification Check failed" in details:  # the certificate is for another name
        return errors.Unavailable(details + HOSTNAME_HINT, code_name=name, retriable=False)
    elif tls and "WRONG_VERSION_NUMBER" in details:  # a TLS client at a plaintext server: again and again
        return errors.Unavailable(details + PLAINTEXT_HINT, code_name=name, retriable=False)
    elif any(said in details for said in _NO_CONNECTION):  # the connect timeout: the server, not TLS
        details += NO_CONNECTION_HINT
    elif any(said in details for said in _NO_ANSWER):
        details += NO_ANSWER_HINT
    elif not tls and "failed to connect to all addresses" in details and any(said in details for said in _CLOSED):
        details += TLS_HINT
    return errors.transport_error(name, details)
