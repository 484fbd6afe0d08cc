"""What `stats` and `top` ask the proxy: which brokers exist, and every broker's Stats, through its admin service.

The proxy's ``popgate.admin.v1.Admin`` (proto/ext/admin.proto, docs/PROXY.md) fans a Stats out to every broker it
routes to and names each that did not answer; ListBrokers lists them, down ones too. Calls carry the v2
credentials and go over the v2 connection's TLS (``--access-key``, ``--tls``...), as every other command's. A proxy
without the admin service (UNIMPLEMENTED: an older one) still names the brokers it sees live through v2
QueryRoute, so `stats` can name a broker left out of ``--broker``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import admin_pb2 as apb
from popgate_pb.ext import admin_pb2_grpc as apb_grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as v2pb
from popgate_pb.v2 import service_pb2_grpc as v2grpc

from popgate_contract.admin_headers import broker_timeout_header

from .._transport import CHANNEL_OPTIONS, channel_credentials, make_options
from .options import check_listening, connection

PROBE_TOPIC = "popgate-stats"  # asked the route of when no topic is known to exist
# The proxy waits for each broker the command's --timeout (it is told: `_fan_out`) and names those that did not
# answer in it: a call through it waits that much longer, so a hung broker is named, not taken for a hung proxy.
PROXY_FAN_OUT_S = 5.0


class ProxyAdminError(Exception):
    """The proxy refused or failed an admin call (one line: its address, the status code and what it said)."""


@dataclass
class ProxyStats:
    """Every broker's Stats as the proxy gathered them."""

    answers: dict[str, bpb.StatsResponse] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # broker -> status code name


class ProxyAdmin:
    """A connection to the proxy at ``args.endpoint`` for admin calls; NothingListens when no proxy is there."""

    def __init__(self, args: argparse.Namespace, timeout: float) -> None:
        check_listening(args.endpoint)
        options = make_options(args.endpoint, namespace="", request_timeout=timeout, retry=None, **connection(args))
        creds = channel_credentials(options)
        self.endpoint = args.endpoint
        self._timeout = timeout
        self._metadata = options.metadata()
        if creds is None:
            self._channel = grpc.insecure_channel(options.endpoint, CHANNEL_OPTIONS)
        else:
            self._channel = grpc.secure_channel(options.endpoint, creds, CHANNEL_OPTIONS)
        self._admin = apb_grpc.AdminStub(self._channel)  # type: ignore[no-untyped-call]

    def _fan_out(self) -> tuple[tuple[str, str], ...]:
        """A fanned-out call's metadata: the proxy waits for each broker `--timeout`, not its own
        --broker-timeout-s (popgate_contract.admin_headers)."""
        return (*self._metadata(), broker_timeout_header(self._timeout))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ProxyAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _failed(self, what: str, exc: grpc.RpcError) -> ProxyAdminError:
        return ProxyAdminError(f"the proxy at {self.endpoint} did not {what}: {exc.code().name}: {exc.details()}")

    def stats(self, request: bpb.StatsRequest) -> ProxyStats:
        """Every broker's Stats, with each one that did not answer named; ProxyAdminError when the proxy fails."""
        try:
            reply = self._admin.Stats(request, timeout=self._timeout + PROXY_FAN_OUT_S, metadata=self._fan_out())
        except grpc.RpcError as exc:
            raise self._failed("gather its brokers' stats", exc) from None
        out = ProxyStats({a.broker: a for a in reply.answers})
        out.failures = {f.broker: f.code for f in reply.failures}
        return out

    def call(self, method: str, request: Any, what: str) -> Any:
        """One of the admin service's fanned-out calls by name (ResetOffset, DeleteGroup, ...: `operate.py`), with
        the proxy's own time for its brokers on top of --timeout; ProxyAdminError when the proxy fails it."""
        try:
            return getattr(self._admin, method)(
                request, timeout=self._timeout + PROXY_FAN_OUT_S, metadata=self._fan_out()
            )
        except grpc.RpcError as exc:
            raise self._failed(what, exc) from None

    def list_messages(self, broker: str, request: bpb.ListMessagesRequest) -> bpb.ListMessagesResponse:
        """One page of a queue of `broker`, as the broker's ListMessages; ProxyAdminError when it fails."""
        wrapped = apb.ListMessagesRequest(broker=broker, request=request)
        try:
            return self._admin.ListMessages(  # type: ignore[no-any-return]
                wrapped, timeout=self._timeout + PROXY_FAN_OUT_S, metadata=self._fan_out()
            )
        except grpc.RpcError as exc:
            raise self._failed(f"list {request.topic} of broker {broker}", exc) from None

    def broker_names(self, topic: str) -> set[str]:
        """The brokers the proxy routes to: all of them (ListBrokers), or on a proxy without the admin service the
        live ones (v2 QueryRoute of `topic`, which should exist). ProxyAdminError when it does not tell."""
        try:
            reply = self._admin.ListBrokers(apb.ListBrokersRequest(), timeout=self._timeout, metadata=self._metadata())
            return {b.name for b in reply.brokers}
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                raise self._failed("list its brokers", exc) from None
        return self._routed(topic)

    def _routed(self, topic: str) -> set[str]:
        stub = v2grpc.MessagingServiceStub(self._channel)  # type: ignore[no-untyped-call]
        request = v2pb.QueryRouteRequest(topic=v2.Resource(name=topic))
        try:
            reply = stub.QueryRoute(request, timeout=self._timeout, metadata=self._metadata())
        except grpc.RpcError as exc:
            raise self._failed("list its brokers", exc) from None
        if reply.status.code != v2.OK:
            code = reply.status.code
            name = v2.Code.Name(code) if code in v2.Code.values() else str(code)
            raise ProxyAdminError(
                f"the proxy at {self.endpoint} did not list its brokers: {name}: {reply.status.message}"
            )
        return {q.broker.name for q in reply.message_queues}
