"""Telemetry: answer each client Settings command with the server's settings (status OK).

The official clients overwrite their limits from the reply: publishing.max_body_size
must be set (0 would refuse every send), a push consumer needs
subscription.long_polling_timeout (0 would busy-loop) and reads the retry back-off, whose
max_attempts is the consumer group's at its brokers (proxy.attempts).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from popgate_pb import broker_pb2 as bpb
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from proxy import validate
from proxy.attempts import DEFAULT_MAX_ATTEMPTS, GroupAttempts
from proxy.settings import Settings
from proxy.txchecks import Outbox, ProducerStreams
from proxy.v2.convert import to_client

# RocketMQ's default consumer retry delays (1s 5s 10s 30s 1m ... 2h) for attempts 1..17 (the last for any after).
RETRY_DELAYS_S = (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
PRODUCER_ATTEMPTS = 3
MAX_SETTINGS_BYTES = 64 * 1024  # an official client's Settings are well under 1 KiB; RocketMQ names no limit


def settings_reply(
    client: v2.Settings, settings: Settings, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS
) -> pb.TelemetryCommand:
    """The answer to a client's settings; `max_attempts`: its consumer group's max delivery attempts.

    An echo of the client's settings with the server's limits, without the lists no client reads back (its
    publishing topics, its subscription entries) or its user agent: a client that does not read its replies keeps
    each one queued at the proxy, so a reply's size does not grow with what the client sent —
    tests/unit/proxy/test_v2_edge.py::test_settings_reply_does_not_echo_the_clients_lists_or_user_agent."""
    reply = v2.Settings()
    reply.CopyFrom(client)
    reply.ClearField("user_agent")
    if reply.HasField("publishing"):  # not touched otherwise: it shares a oneof with subscription
        reply.publishing.ClearField("topics")
    if reply.HasField("subscription"):
        reply.subscription.ClearField("subscriptions")
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
        # off (a busy loop of receives); so a client asking less than a second is answered 1 s.
        seconds = min(math.ceil(wanted), math.floor(settings.max_long_polling_s))  # up, but not past the most
        sub.long_polling_timeout.CopyFrom(Duration(seconds=max(1, seconds)))
        sub.receive_batch_size = settings.max_batch
        # In order only for the groups configured so (RocketMQ's orderly consumer groups): the official PushConsumer
        # then consumes one message at a time and retries a failed one itself before the next.
        sub.fifo = _fifo_group(client.subscription.group, settings)
        reply.backoff_policy.Clear()
        reply.backoff_policy.max_attempts = max_attempts
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


def _group_name(group: v2.Resource) -> str | None:
    """The group as stored (`namespace%name` in a namespace); None for a bad name, which is refused where it is
    used (receive, ack), not in a settings reply."""
    try:
        return validate.group_in(group.resource_namespace, group.name)
    except errors.DomainError:
        return None


def _fifo_group(group: v2.Resource, settings: Settings) -> bool:
    """Whether `group` is one of --fifo-group."""
    return bool(settings.fifo_groups) and _group_name(group) in settings.fifo_groups


async def _max_attempts(client: v2.Settings, attempts: GroupAttempts) -> int:
    """A consumer's group's, as its brokers have it (a producer's answer has none)."""
    group = _group_name(client.subscription.group) if client.HasField("subscription") else None
    return DEFAULT_MAX_ATTEMPTS if group is None else await attempts.of(group)


def _published(client: v2.Settings, publishable: Callable[[str], bool]) -> list[str]:
    """The topics (as stored) a producer's settings publish to and its account may publish to; bad names are left
    out (refused where sent), and so are topics the account may not publish to: their transaction checks carry
    the half messages' bodies."""
    out = []
    for topic in client.publishing.topics if client.HasField("publishing") else ():
        try:
            name = validate.topic_in(topic.resource_namespace, topic.name)
        except errors.DomainError:
            continue
        if publishable(name):
            out.append(name)
    return out


async def telemetry(
    commands: AsyncIterator[pb.TelemetryCommand],
    settings: Settings,
    closing: asyncio.Event,
    attempts: GroupAttempts,
    producers: ProducerStreams | None = None,
    publishable: Callable[[str], bool] = lambda topic: True,
) -> AsyncIterator[pb.TelemetryCommand]:
    """Reply to every Settings command until the client closes the stream or the proxy shuts down; meanwhile
    pass on the commands `producers` queue for this stream (transaction checks, proxy.txchecks)."""
    closed = asyncio.ensure_future(closing.wait())
    next_command: asyncio.Future[pb.TelemetryCommand] | None = None
    outgoing: asyncio.Future[pb.TelemetryCommand] | None = None
    outbox = Outbox()
    try:
        while True:
            if next_command is None:
                next_command = asyncio.ensure_future(anext(commands))
            if outgoing is None:
                outgoing = asyncio.ensure_future(outbox.commands.get())
            waits: set[asyncio.Future[Any]] = {next_command, closed, outgoing}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if outgoing.done():
                yield outgoing.result()
                outgoing = None
            if closed.done():
                return
            if not next_command.done():
                continue
            try:
                command = next_command.result()
            except StopAsyncIteration:
                return
            except DecodeError:  # the client's bytes, not the proxy's fault: its status, not an internal error
                text = "a TelemetryCommand that does not decode"  # the stream's requests end with it
                yield pb.TelemetryCommand(status=v2.Status(code=v2.BAD_REQUEST, message=text))
                return
            next_command = None
            if command.HasField("settings"):
                size = command.settings.ByteSize()
                if size > MAX_SETTINGS_BYTES:
                    text = f"Settings of {size} bytes: at most {MAX_SETTINGS_BYTES} (topics, subscriptions, endpoints)"
                    yield pb.TelemetryCommand(status=v2.Status(code=v2.BAD_REQUEST, message=text))
                    continue
                if producers is not None and (topics := _published(command.settings, publishable)):
                    outbox.namespace = command.settings.publishing.topics[0].resource_namespace  # one per client
                    producers.register(outbox, topics)
                max_attempts = await _max_attempts(command.settings, attempts)
                yield settings_reply(command.settings, settings, max_attempts=max_attempts)
            # Other commands (thread stack traces, verify results) answer requests this proxy never makes.
    finally:
        closed.cancel()
        if producers is not None:
            producers.unregister(outbox)
        if outgoing is not None:
            outgoing.cancel()
        if next_command is not None:
            # Also when the client cancels the stream: the read ends (StopAsyncIteration, an RPC error)
            # after this generator, and its outcome is read here, not logged as never retrieved.
            next_command.cancel()
            next_command.add_done_callback(_ignore_outcome)


def _ignore_outcome(future: asyncio.Future[pb.TelemetryCommand]) -> None:
    if not future.cancelled():
        future.exception()


def recover_command(check: bpb.TransactionCheck, outbox: Outbox) -> pb.TelemetryCommand:
    """A check of a half message as the official producers read it: a RecoverOrphanedTransactionCommand."""
    command = pb.TelemetryCommand()
    recover = command.recover_orphaned_transaction_command
    recover.transaction_id = check.transaction_id
    popped = bpb.PoppedMessage(stored=check.message, delivery_attempt=1)
    to_client(popped, namespace=outbox.namespace, out=recover.message)
    recover.message.system_properties.ClearField("receipt_handle")
    return command
