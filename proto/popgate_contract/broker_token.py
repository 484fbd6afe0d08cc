"""Proxy↔broker authentication with a shared token (``--broker-token`` on both sides).

The proxy sends ``x-popgate-token: <token>`` on every broker call (a channel
interceptor); a broker with a token configured answers any other call with
UNAUTHENTICATED. The standard health service stays open (Kubernetes probes send
no token). Run it over a private network or TLS: the token is a bearer secret.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

TOKEN_KEY = "x-popgate-token"
_OPEN_PREFIX = "/grpc.health.v1.Health/"


def token_ok(metadata: Any, token: str) -> bool:
    for key, value in metadata or ():
        if key == TOKEN_KEY:
            given = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            return hmac.compare_digest(given.encode(), token.encode())
    return False


async def _refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, f"broker requires the proxy's token ({TOKEN_KEY})")


async def _refuse_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await _refuse(request, context)


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses calls without the shared token, except health checks."""

    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = handler_call_details.method
        if method.startswith(_OPEN_PREFIX) or token_ok(handler_call_details.invocation_metadata, self._token):
            return await continuation(handler_call_details)
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(_refuse_stream)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(_refuse)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(_refuse_stream)
        return grpc.unary_unary_rpc_method_handler(_refuse)


def _with_token(details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*(details.metadata or ()))
    metadata.add(TOKEN_KEY, token)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
    )


class _Unary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self._token), request)


class _Stream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return await continuation(_with_token(details, self._token), request_iterator)


def client_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    """Channel interceptors that add the token to every unary and bidi call (none without a token)."""
    return [_Unary(token), _Stream(token)] if token else []
