"""In-memory broker clients for the proxy core's unit tests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from proxy.outgoing import Chunk, chunks, runs_of
from proxy.ports import Health


class FakeBroker:
    def __init__(self, name: str, *, healthy: bool = True) -> None:
        self.name = name
        self._status = Health(healthy)
        self.fail: errors.DomainError | None = None
        self.sent: list[bpb.Message] = []
        self.pops: list[bpb.PopRequest] = []
        self.acks: list[bpb.AckRequest] = []
        self.renews: list[bpb.RenewRequest] = []
        self.changes: list[bpb.ChangeInvisibleTimesRequest] = []
        self.ready: list[bpb.PoppedMessage] = []
        self.polling_full = False
        self.arrived = asyncio.Event()
        self.notifications: list[bpb.NotificationRequest] = []
        self.passed_on = 0  # has_message answers handed back unused (the broker passes their wakes on)
        self.held = 0  # Pops and Notifications being held right now
        self.changed = asyncio.Event()  # set (and replaced) whenever `held` changes
        self.max_attempts: dict[str, int] = {}  # GroupConfig's answer by group (17 for the others)

    @property
    def healthy(self) -> bool:
        return self._status.up

    @property
    def recoveries(self) -> int:
        return self._status.recoveries

    @healthy.setter
    def healthy(self, healthy: bool) -> None:
        """What the health checks see; waiters on `when_up` wake when it turns True."""
        self._status.set(healthy)

    def when_up(self) -> asyncio.Future[None]:
        return self._status.when_up()

    def retire(self) -> None:
        """Replaced or gone from discovery (as `GrpcBrokerClient.retire`): down for good, its waiters woken."""
        self._status.set(False)
        self._status.wake()

    def _held(self, delta: int) -> None:
        self.held += delta
        self.changed.set()
        self.changed = asyncio.Event()

    def put(self, *messages: bpb.PoppedMessage) -> None:
        """A message arrives: held requests wake."""
        self.ready.extend(messages)
        self.arrived.set()
        self.arrived = asyncio.Event()

    async def _hold(self, poll_ms: int) -> None:
        self._held(+1)
        try:
            await asyncio.wait_for(self.arrived.wait(), poll_ms / 1000)
        except TimeoutError:
            pass
        finally:
            self._held(-1)

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    async def send(self, chunk: Chunk, *, timeout_s: float) -> Sequence[bpb.SendResult]:
        """Kept as the broker reads them (`sent`): the Send parsed, each run's messages made whole."""
        self._check()
        messages = sent_messages(bpb.SessionRequest.FromString(b"".join(chunk.request(runs=True))).send)
        start = len(self.sent)
        self.sent.extend(messages)
        return [
            bpb.SendResult(message_id=m.message_id, topic=m.topic, offset=start + i) for i, m in enumerate(messages)
        ]

    async def pop(self, request: bpb.PopRequest, *, timeout_s: float) -> bpb.PopResponse:
        self._check()
        self.pops.append(request)
        held = not self.ready and request.poll_ms > 0 and not self.polling_full
        if held:
            await self._hold(request.poll_ms)
        taken, self.ready = self.ready[: request.max_messages], self.ready[request.max_messages :]
        return bpb.PopResponse(messages=taken, polling_full=self.polling_full, held=held)

    async def ack(self, request: bpb.AckRequest, *, timeout_s: float) -> bpb.AckResponse:
        self._check()
        self.acks.append(request)
        return bpb.AckResponse(results=_results(request.receipt_handles))

    async def change_invisible_time(
        self, request: bpb.ChangeInvisibleTimeRequest, *, timeout_s: float
    ) -> bpb.ChangeInvisibleTimeResponse:
        self._check()
        return bpb.ChangeInvisibleTimeResponse(receipt_handle=request.receipt_handle + "-new")

    async def change_invisible_times(
        self, request: bpb.ChangeInvisibleTimesRequest, *, timeout_s: float
    ) -> list[str | errors.DomainError]:
        """A handle with token 5a1e refused as stale (as by `_results`), the others given it with "-new" appended."""
        self._check()
        self.changes.append(request)
        return [errors.InvalidReceiptHandle("stale") if "~5a1e~" in h else h + "-new" for h in request.receipt_handles]

    async def dead_letter(self, request: bpb.DeadLetterRequest, *, timeout_s: float) -> bpb.DeadLetterResponse:
        self._check()
        return bpb.DeadLetterResponse(dlq_topic="%DLQ%" + request.group)

    async def group_config(self, group: str, *, timeout_s: float) -> bpb.GroupConfigResponse:
        self._check()
        return bpb.GroupConfigResponse(max_delivery_attempts=self.max_attempts.get(group, 17))

    async def renew(self, request: bpb.RenewRequest, *, timeout_s: float) -> bpb.RenewResponse:
        self._check()
        self.renews.append(request)
        return bpb.RenewResponse(results=_results(request.receipt_handles), invisible_until_ms=1_700_000_060_000)

    def begin_pop(self, request: bpb.PopRequest, *, timeout_s: float) -> asyncio.Future[bpb.PopResponse]:
        return asyncio.ensure_future(self.pop(request, timeout_s=timeout_s))

    def release(self, call: asyncio.Future[Any]) -> None:
        """Messages popped that nobody received: ready again (as the broker does on a late cancel frame); a
        has_message nobody used: counted (the broker passes its wake on)."""
        answer = call.result()
        if isinstance(answer, bpb.NotificationResponse):
            self.passed_on += 1
        else:
            self.ready = [*answer.messages, *self.ready]

    def begin_notification(
        self, request: bpb.NotificationRequest, *, timeout_s: float
    ) -> asyncio.Future[bpb.NotificationResponse]:
        return asyncio.ensure_future(self.notification(request, timeout_s=timeout_s))

    async def notification(self, request: bpb.NotificationRequest, *, timeout_s: float) -> bpb.NotificationResponse:
        self._check()
        self.notifications.append(request)
        if self.polling_full:
            return bpb.NotificationResponse(polling_full=True)
        if not self.ready and request.poll_ms > 0:
            await self._hold(request.poll_ms)
        return bpb.NotificationResponse(has_message=bool(self.ready))


def sent_messages(request: bpb.SendRequest) -> list[bpb.Message]:
    """The messages a Send stores, in its answer's order: its messages, then each run's."""
    out = list(request.messages)
    for run in request.runs:
        for body, message_id in zip(run.bodies, run.message_ids, strict=True):
            m = bpb.Message()
            m.CopyFrom(run.shared)
            m.body, m.message_id = body, message_id
            out.append(m)
    return out


def one_send(*messages: bpb.Message) -> Chunk:
    """A broker Send of `messages`, as the proxy makes one."""
    placed, start = [], 0
    for run in runs_of(messages):
        placed.append((start, run))
        start += len(run.ids)
    [chunk] = chunks(placed, budget=1 << 30)
    return chunk


def _results(handles: Sequence[str]) -> list[bpb.AckResult]:
    """Ack and Renew: a handle with token 5a1e plays a stale one (the message was redelivered since)."""
    return [
        bpb.AckResult(receipt_handle=h, ok=True)
        if "~5a1e~" not in h
        else bpb.AckResult(receipt_handle=h, ok=False, error="InvalidReceiptHandle", error_message="stale")
        for h in handles
    ]


def handle(broker: str, *, token: str = "ab", topic: str = "t") -> str:
    """A well-formed popgate receipt handle naming `broker`."""
    return f"1~{broker}~{topic}~0~5~1~{token}~1700000000000"


def popped(
    broker: str, message_id: str, *, body: bytes = b"hi", attempt: int = 1, token: str = "ab"
) -> bpb.PoppedMessage:
    stored = bpb.StoredMessage(
        message=bpb.Message(topic="t", message_id=message_id, body=body),
        queue_id=1,
        offset=7,
        store_ms=1_700_000_000_123,
    )
    return bpb.PoppedMessage(stored=stored, receipt_handle=handle(broker, token=token), delivery_attempt=attempt)


class Frames:
    """A call context's `write`, as grpc gives it to a server-streaming handler: the frames written, in order. With
    `stall_at`, the write of that frame (0-based) and every later one returns only once `resume` is set: a client
    that stops reading (`stalled` is set then)."""

    def __init__(self, stall_at: int | None = None) -> None:
        self.frames: list[Any] = []
        self.stall_at = stall_at
        self.stalled = asyncio.Event()
        self.resume = asyncio.Event()

    async def write(self, frame: Any) -> None:
        self.frames.append(frame)
        if self.stall_at is not None and len(self.frames) > self.stall_at:
            self.stalled.set()
            await self.resume.wait()
