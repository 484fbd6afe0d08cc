"""What every v2 handler gets: the core, the settings and the call's deadline."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from popgate_pb.v2 import definition_pb2 as v2

from proxy.core import Proxy
from proxy.settings import Settings, parse_host_port
from proxy.v2.access import client_id_of


@dataclass(frozen=True, slots=True)
class Call:
    proxy: Proxy
    settings: Settings
    endpoints: v2.Endpoints  # the proxy's own address, for requests that name none
    deadline: float | None  # loop.time() of the client's deadline, None without one
    metadata: tuple[Any, ...] = ()  # the call's invocation metadata, as grpc gives it
    account: str = ""  # the caller's access key ("" without accounts): its client ids are its own (proxy.renewal)

    @property
    def client_id(self) -> str:
        """The x-mq-client-id metadata ("" when absent): whose auto_renew handles to renew. Read only by the calls
        that need it (an auto_renew receive, NotifyClientTermination), not by every RPC."""
        return client_id_of(self.metadata)


def endpoints_for(address: str) -> v2.Endpoints:
    host, port = parse_host_port(address, what="endpoint")
    try:
        scheme = v2.IPv6 if ipaddress.ip_address(host).version == 6 else v2.IPv4
    except ValueError:
        scheme = v2.DOMAIN_NAME
    return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=port)])
