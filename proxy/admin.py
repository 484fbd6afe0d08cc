"""The admin service (`popgate.admin.v1.Admin`, proto/ext/admin.proto) on the proxy's client port: operators'
questions and operations (stats, offset reset, group and topic deletion and creation, message queries, live
consumers) fanned out to every broker the proxy routes to, so the `popgate` command needs only `--endpoint`.

Every call authenticates as v2 calls do and, when the proxy has accounts, needs one with ``admin = true``
(UNAUTHENTICATED / PERMISSION_DENIED otherwise) — tests/integration/proxy/test_admin.py. A broker that does not
answer is reported by name in the answer, never dropped from it silently.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from popgate_pb import broker_pb2 as bpb
from popgate_pb.ext import admin_pb2 as apb
from popgate_pb.ext import admin_pb2_grpc as apb_grpc

from popgate_contract import errors
from popgate_contract.admin_headers import broker_timeout_of
from popgate_contract.consumers import EVERY_GROUP_LIMIT, first_consumers, latest_consumers
from popgate_contract.trailer import ERROR_KEY, NEVER_CONNECTED, status_of
from popgate_contract.validation import check_group, check_topic
from proxy.auth import Authenticator
from proxy.routing import BrokerPool
from proxy.v2.access import metadata_of

log = logging.getLogger(__name__)
R = TypeVar("R")
# How long this call waits for each broker (`AdminService._serve`; each call is a task of its own on either server:
# grpc.aio's per call, popgate_process/h2grpc/server.py `run`'s).
_broker_wait: contextvars.ContextVar[float] = contextvars.ContextVar("broker_wait")
REPLY_MARGIN_S = 0.5  # of the call's deadline, for the answer to reach the caller once the brokers' wait is over
MIN_BROKER_WAIT_S = 0.05


# The admin calls that change brokers' state: one made while a broker is retired is not applied to it.
CHANGES = frozenset({"CreateTopic", "DeleteTopic", "DeleteGroup", "ResetOffset"})
NOT_ASKED = "retired (gone from broker discovery): not asked; if it comes back, run the change again"


def _may_have_applied(error: errors.DomainError) -> bool:
    """Whether a broker's failed call may have made its change there: it reached the broker and ended without an
    answer (a deadline, a connection cut, the broker stopping), or the broker failed midway (its store refused the
    commit: memory changed, the rows follow). Not when it never left (nothing listening: grpc's "failed to connect")
    nor when the broker refused it — tests/integration/proxy/test_admin_failures.py."""
    if isinstance(error, errors.BrokerNotReached) or NEVER_CONNECTED in error.message:
        return False
    return isinstance(
        error, (errors.BrokerUnavailable, errors.BrokerTimeout, errors.BrokerFailure, errors.StoreUnavailable)
    )


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
        deleted: Callable[..., None] | None = None,
    ) -> None:
        self._pool = pool
        self._brokers = brokers
        self._auth = authenticator
        self._timeout_s = timeout_s
        self._deleted = deleted  # told of each group or topic deleted (`Proxy.deleted`: announced no more)

    async def _serve(self, context: grpc.aio.ServicerContext, answer: Callable[[], Awaitable[R]]) -> R:
        """`answer()` after the admin check (not started when it fails), a domain error as its status code and the
        popgate-error trailer. Each broker is waited for as long as the caller asked (`admin_headers`), else
        --broker-timeout-s, within the call's own deadline."""
        try:
            metadata = metadata_of(context.invocation_metadata())
            check_admin(self._auth, metadata)
            wait = broker_timeout_of(metadata) or self._timeout_s
            remaining = context.time_remaining()
            if remaining is not None:
                wait = min(wait, max(MIN_BROKER_WAIT_S, remaining - REPLY_MARGIN_S))
            waiting = _broker_wait.set(wait)
            try:
                return await answer()
            finally:
                _broker_wait.reset(waiting)
        except errors.DomainError as exc:
            context.set_trailing_metadata(((ERROR_KEY, exc.name),))
            await context.abort(status_of(exc), exc.message)
        raise AssertionError("unreachable")

    async def ListBrokers(
        self, request: apb.ListBrokersRequest, context: grpc.aio.ServicerContext
    ) -> apb.ListBrokersResponse:
        return await self._serve(context, self._list_brokers)

    async def _list_brokers(self) -> apb.ListBrokersResponse:
        views = [apb.Broker(name=b.name, address=b.address, up=b.up) for b in self._brokers()]
        return apb.ListBrokersResponse(brokers=views)

    async def _fan_out(self, method: str, request: Any) -> tuple[list[Any], list[apb.BrokerFailure]]:
        """`method` at every broker this proxy routes to (down ones too: they are named, not skipped): the answers,
        and each broker that did not answer with its status; a change also names the brokers discovery retired
        (scaled down: one may come back with its store, without the change). When every broker refused the request
        as bad input, that refusal is the call's (nothing was done anywhere)."""
        clients = [c for c in map(self._pool.get, self._pool.names) if c is not None]
        if not clients:  # nothing done anywhere: not an empty success (test_admin_fanout.py::
            # test_a_proxy_that_routes_to_no_broker_says_so_and_does_nothing)
            raise errors.BrokerUnavailable(f"this proxy routes to no broker: {method} was not done anywhere")
        calls = [c.admin(method, request, timeout_s=_broker_wait.get(self._timeout_s)) for c in clients]
        results = await asyncio.gather(*calls, return_exceptions=True)
        answers: list[Any] = []
        failures: list[apb.BrokerFailure] = []
        refusals: list[errors.BadRequest] = []
        for client, result in zip(clients, results, strict=True):
            if isinstance(result, errors.DomainError):
                code = status_of(result).name
                failures.append(
                    apb.BrokerFailure(
                        broker=client.name, code=code, message=result.message, outcome_unknown=_may_have_applied(result)
                    )
                )
                if isinstance(result, errors.BadRequest):
                    refusals.append(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                answers.append(result)
        if refusals and len(refusals) == len(results):
            raise refusals[0]
        if method in CHANGES:  # test_admin_fanout.py::test_a_change_names_the_brokers_discovery_retired_as_not_asked
            retired = sorted({c.name for c in self._pool.clients()} - set(self._pool.names))
            failures += [apb.BrokerFailure(broker=name, code="UNAVAILABLE", message=NOT_ASKED) for name in retired]
        return answers, failures

    async def Stats(self, request: bpb.StatsRequest, context: grpc.aio.ServicerContext) -> apb.StatsResponse:
        return await self._serve(context, lambda: self._answer("Stats", request, apb.StatsResponse))

    async def _answer(self, method: str, request: Any, response: Callable[..., R]) -> R:
        answers, failures = await self._fan_out(method, request)
        return response(answers=answers, failures=failures)

    async def ResetOffset(
        self, request: bpb.ResetOffsetRequest, context: grpc.aio.ServicerContext
    ) -> apb.ResetOffsetResponse:
        return await self._serve(context, lambda: self._answer("ResetOffset", request, apb.ResetOffsetResponse))

    async def DeleteGroup(
        self, request: bpb.DeleteGroupRequest, context: grpc.aio.ServicerContext
    ) -> apb.DeleteGroupResponse:
        async def answer() -> apb.DeleteGroupResponse:
            # Forgotten before the fan-out (no announcement after it), once the names are known good: an empty one
            # would forget every group — test_admin_fanout.py::test_a_refused_deletion_forgets_nothing
            check_group(request.group)
            if request.topic:
                check_topic(request.topic)
            self._forget(topic=request.topic, group=request.group)
            return await self._answer("DeleteGroup", request, apb.DeleteGroupResponse)

        return await self._serve(context, answer)

    async def CreateTopic(
        self, request: bpb.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> apb.CreateTopicResponse:
        return await self._serve(context, lambda: self._answer("CreateTopic", request, apb.CreateTopicResponse))

    async def DeleteTopic(
        self, request: bpb.DeleteTopicRequest, context: grpc.aio.ServicerContext
    ) -> apb.DeleteTopicResponse:
        async def answer() -> apb.DeleteTopicResponse:
            self._forget(topic=check_topic(request.topic))
            return await self._answer("DeleteTopic", request, apb.DeleteTopicResponse)

        return await self._serve(context, answer)

    def _forget(self, *, topic: str = "", group: str = "") -> None:
        if self._deleted is not None:
            self._deleted(topic=topic, group=group)

    async def QueryMessages(
        self, request: bpb.QueryMessagesRequest, context: grpc.aio.ServicerContext
    ) -> apb.QueryMessagesResponse:
        return await self._serve(context, lambda: self._query(request))

    async def _query(self, request: bpb.QueryMessagesRequest) -> apb.QueryMessagesResponse:
        answers, failures = await self._fan_out("QueryMessages", request)
        found = [m for a in answers for m in a.messages]
        found.sort(key=lambda m: (m.stored.store_ms, m.broker, m.stored.queue_id, m.stored.offset), reverse=True)
        return apb.QueryMessagesResponse(
            messages=found[: request.max_messages],
            failures=failures,
            scanned=sum(a.scanned for a in answers),
            scan_cut=any(a.scan_cut for a in answers),
        )

    async def ListConsumers(
        self, request: bpb.ListConsumersRequest, context: grpc.aio.ServicerContext
    ) -> apb.ListConsumersResponse:
        return await self._serve(context, lambda: self._consumers(request))

    async def _consumers(self, request: bpb.ListConsumersRequest) -> apb.ListConsumersResponse:
        """Every broker holds every proxy's report: the latest sighting of each client of a group over the answers;
        of every group, the first EVERY_GROUP_LIMIT and `cut` when more are live."""
        answers, failures = await self._fan_out("ListConsumers", request)
        if request.group:
            consumers, cut = latest_consumers(c for a in answers for c in a.consumers), False
        else:
            consumers, cut = first_consumers(answers, EVERY_GROUP_LIMIT)
        return apb.ListConsumersResponse(consumers=consumers, failures=failures, cut=cut)

    async def ListMessages(
        self, request: apb.ListMessagesRequest, context: grpc.aio.ServicerContext
    ) -> bpb.ListMessagesResponse:
        return await self._serve(context, lambda: self._list_messages(request))

    async def _list_messages(self, request: apb.ListMessagesRequest) -> bpb.ListMessagesResponse:
        client = self._pool.get(request.broker) if request.broker in self._pool.names else None
        if client is None:
            known = ", ".join(self._pool.names) or "none"
            raise errors.BadRequest(f"this proxy routes to no broker named {request.broker!r} (brokers: {known})")
        return await client.list_messages(request.request, timeout_s=_broker_wait.get(self._timeout_s))
