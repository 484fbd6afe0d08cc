"""Telemetry: answer each client Settings command with the server's settings (status OK).

The official clients overwrite their limits from the reply: publishing.max_body_size
must be set (0 would refuse every send), a push consumer needs
subscription.long_polling_timeout (0 would busy-loop) and reads the retry back-off.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

from google.protobuf.duration_pb2 import Duration
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from proxy import errors, validate
from proxy.settings import Settings

# RocketMQ's default consumer retry delays (1s 5s 10s 30s 1m ... 2h) for attempts 1..17.
RETRY_DELAYS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
MAX_DELIVERY_ATTEMPTS = 17
PRODUCER_ATTEMPTS = 3


def settings_reply(client: v2.Settings, settings: Settings) -> pb.TelemetryCommand:
    reply = v2.Settings()
    reply.CopyFrom(client)
    reply.metric.Clear()
    reply.metric.on = False
    if client.HasField("subscription"):
        sub = reply.subscription
        requested = client.subscription.long_polling_timeout
        wanted = (
            requested.seconds + requested.nanos / 1e9 if client.subscription.HasField("long_polling_timeout") else 0
        )
        if wanted <= 0:
            wanted = settings.default_long_polling_s
        wanted = min(max(wanted, settings.min_long_polling_s), settings.max_long_polling_s)
        # Whole seconds, at least 1: the official PushConsumer reads only `seconds`, and 0 turns its long polling
        # off (a busy loop of 3 s receives); a client asking 1 ns was answered 0 s and 1 ns.
        seconds = min(math.ceil(wanted), math.floor(settings.max_long_polling_s))  # up, but not past the most
        sub.long_polling_timeout.CopyFrom(Duration(seconds=max(1, seconds)))
        sub.receive_batch_size = settings.max_batch
        # In order only for the groups configured so (RocketMQ's orderly consumer groups): the official PushConsumer
        # then consumes one message at a time and retries a failed one itself before the next.
        sub.fifo = _fifo_group(client.subscription.group, settings)
        reply.backoff_policy.Clear()
        reply.backoff_policy.max_attempts = MAX_DELIVERY_ATTEMPTS
        reply.backoff_policy.customized_backoff.next.extend(Duration(seconds=s) for s in RETRY_DELAYS_S)
    else:
        pub = reply.publishing
        pub.max_body_size = settings.max_body_bytes
        pub.validate_message_type = True
        reply.backoff_policy.Clear()
        reply.backoff_policy.max_attempts = PRODUCER_ATTEMPTS
        backoff = reply.backoff_policy.exponential_backoff
        backoff.initial.FromMilliseconds(10)
        backoff.max.FromMilliseconds(1000)
        backoff.multiplier = 2.0
    return pb.TelemetryCommand(status=v2.Status(code=v2.OK, message="OK"), settings=reply)


def _fifo_group(group: v2.Resource, settings: Settings) -> bool:
    """Whether `group` is one of --fifo-group (as stored: `namespace%name` in a namespace)."""
    if not settings.fifo_groups:
        return False
    try:
        return validate.group_in(group.resource_namespace, group.name) in settings.fifo_groups
    except errors.ProxyError:  # a bad name is refused where it is used (receive, ack), not in a settings reply
        return False


async def telemetry(
    commands: AsyncIterator[pb.TelemetryCommand], settings: Settings, closing: asyncio.Event
) -> AsyncIterator[pb.TelemetryCommand]:
    """Reply to every Settings command until the client closes the stream or the proxy shuts down."""
    closed = asyncio.ensure_future(closing.wait())
    next_command: asyncio.Future[pb.TelemetryCommand] | None = None
    try:
        while True:
            next_command = asyncio.ensure_future(anext(commands))
            await asyncio.wait({next_command, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not next_command.done():
                return
            try:
                command = next_command.result()
            except StopAsyncIteration:
                return
            if command.HasField("settings"):
                yield settings_reply(command.settings, settings)
            # Other commands (thread stack traces, verify results) answer requests this proxy never makes.
    finally:
        closed.cancel()
        if next_command is not None:
            # Also when the client cancels the stream: the read ends (StopAsyncIteration, an RPC error)
            # after this generator, and its outcome is read here, not logged as never retrieved.
            next_command.cancel()
            next_command.add_done_callback(_ignore_outcome)


def _ignore_outcome(future: asyncio.Future[pb.TelemetryCommand]) -> None:
    if not future.cancelled():
        future.exception()
