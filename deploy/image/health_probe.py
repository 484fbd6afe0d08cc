#!/usr/bin/env python3
"""Exec probe: ask a server's standard gRPC health service (grpc.health.v1) whether it is SERVING.

    popgate-grpc-health [--tls-ca FILE] [--server-name NAME] [--service NAME] [--timeout-s S] HOST:PORT

Kubelet's own `grpc:` probe speaks plaintext only, so a proxy serving TLS (--tls-cert/--tls-key) is
probed with this instead: with --tls-ca the channel is TLS, verified against FILE, and --server-name is
the name the certificate must carry (the probe dials 127.0.0.1, which no certificate names). Exit
status 0 when SERVING; otherwise 1 and one line on stderr saying what was answered.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def channel(target: str, *, tls_ca: Path | None, server_name: str) -> grpc.Channel:
    if tls_ca is None:
        return grpc.insecure_channel(target)
    credentials = grpc.ssl_channel_credentials(root_certificates=tls_ca.read_bytes())
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(target, credentials, options=options)


def check(target: str, *, tls_ca: Path | None, server_name: str, service: str, timeout_s: float) -> str:
    """The health status name the server answers, or what went wrong."""
    with channel(target, tls_ca=tls_ca, server_name=server_name) as ch:
        try:
            reply = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="popgate-grpc-health", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="HOST:PORT")
    parser.add_argument("--tls-ca", type=Path, help="PEM CA bundle: use TLS and verify the server against it")
    parser.add_argument("--server-name", default="", help="the name the server's certificate must carry")
    parser.add_argument("--service", default="", help="health service name, default '' (the whole server)")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="default %(default)s")
    args = parser.parse_args(argv)
    try:
        status = check(
            args.target,
            tls_ca=args.tls_ca,
            server_name=args.server_name,
            service=args.service,
            timeout_s=args.timeout_s,
        )
    except OSError as exc:  # the CA file
        status = str(exc)
    if status == "SERVING":
        return 0
    print(f"popgate-grpc-health: {args.target}: {status}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
