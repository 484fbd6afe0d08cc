"""The admin service (`popgate.admin.v1.Admin`, proto/ext/admin.proto) on the proxy's client port: operators'
questions fanned out to every broker the proxy routes to, so the `popgate` command needs only `--endpoint`.

Every call authenticates as v2 calls do and, when the proxy has accounts, needs one with ``admin = true``
(UNAUTHENTICATED / PERMISSION_DENIED otherwise) — tests/integration/proxy/test_admin.py. A broker that does not
answer is reported by name in the answer, never dropped from it silently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import admin_pb2 as apb
from popgate_pb.ext import admin_pb2_grpc as apb_grpc

from popgate_contract import errors
from popgate_contract.trailer import ERROR_KEY, status_of
from proxy.auth import Authenticator
from proxy.routing import BrokerPool
from proxy.v2.access import metadata_of

log = logging.getLogger(__name__)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class BrokerView:
    name: str
    address: str
    up: bool


def check_admin(authenticator: Authenticator, metadata: dict[str, str]) -> None:
    """Unauthorized / Forbidden unless the caller may use the admin service (anyone when auth is off)."""
    account = authenticator.authenticate(metadata)
    if account is not None and not account.admin:
        raise errors.Forbidden(f"access key {account.access_key} is not an admin account (admin = true in [[acl]])")


class AdminService(apb_grpc.AdminServicer):
    def __init__(
        self,
        pool: BrokerPool,
        brokers: Callable[[], Iterable[BrokerView]],
        authenticator: Authenticator,
        *,
        timeout_s: float,
    ) -> None:
        self._pool = pool
        self._brokers = brokers
        self._auth = authenticator
        self._timeout_s = timeout_s

    async def _serve(self, context: grpc.aio.ServicerContext, answer: Awaitable[R]) -> R:
        """`answer` after the admin check, a domain error as its status code and the popgate-error trailer."""
        try:
            check_admin(self._auth, metadata_of(context.invocation_metadata()))
            return await answer
        except errors.DomainError as exc:
            context.set_trailing_metadata(((ERROR_KEY, exc.name),))
            await context.abort(status_of(exc), exc.message)
        raise AssertionError("unreachable")

    async def ListBrokers(
        self, request: apb.ListBrokersRequest, context: grpc.aio.ServicerContext
    ) -> apb.ListBrokersResponse:
        return await self._serve(context, self._list_brokers())

    async def _list_brokers(self) -> apb.ListBrokersResponse:
        views = [apb.Broker(name=b.name, address=b.address, up=b.up) for b in self._brokers()]
        return apb.ListBrokersResponse(brokers=views)

    async def Stats(self, request: bpb.StatsRequest, context: grpc.aio.ServicerContext) -> apb.StatsResponse:
        return await self._serve(context, self._stats(request))

    async def _stats(self, request: bpb.StatsRequest) -> apb.StatsResponse:
        names = self._pool.names
        clients = [self._pool.get(name) for name in names]
        calls = [c.stats(request, timeout_s=self._timeout_s) for c in clients if c is not None]
        results = await asyncio.gather(*calls, return_exceptions=True)
        out = apb.StatsResponse()
        for name, result in zip(names, results, strict=True):
            if isinstance(result, bpb.StatsResponse):
                out.answers.append(result)
            elif isinstance(result, errors.DomainError):
                out.failures.append(apb.BrokerFailure(broker=name, code=status_of(result).name, message=result.message))
            else:
                raise result
        return out

    async def ListMessages(
        self, request: apb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> bpb.ListMessagesResponse:
        return await self._serve(context, self._list_messages(request))

    async def _list_messages(self, request: apb.ListMessagesRequest) -> bpb.ListMessagesResponse:
        client = self._pool.get(request.broker) if request.broker in self._pool.names else None
        if client is None:
            known = ", ".join(self._pool.names) or "none"
            raise errors.BadRequest(f"this proxy routes to no broker named {request.broker!r} (brokers: {known})")
        return await client.list_messages(request.request, timeout_s=self._timeout_s)
