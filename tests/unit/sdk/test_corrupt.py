"""Received messages whose body does not inflate or does not match its digest: not delivered but given back, the
rest of their batch delivered (as RocketMQ's official clients do). Fake stubs, no sockets."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import logging
import zlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import Message, SimpleConsumer, _transport, _wire, aio
from tests.unit.sdk.fakes import FakeChannel, FakeStub
from tests.unit.sdk.test_give_back import SessionChannel, SyncStub, given_back


def md5(body: bytes) -> str:
    return hashlib.md5(body).hexdigest().upper()


def message(
    message_id: str,
    body: bytes,
    *,
    digest: tuple[int, str] | None = None,
    gzipped: bool = False,
    handle: str = "",
) -> v2.Message:
    """A received v2 message; its digest the MD5 of `body` as the proxy computes it unless `digest` says."""
    m = v2.Message(topic=v2.Resource(name="t"), body=body)
    props = m.system_properties
    props.message_id, props.receipt_handle, props.delivery_attempt = message_id, handle or f"{message_id}@0", 1
    props.body_encoding = v2.GZIP if gzipped else v2.IDENTITY
    kind, checksum = digest or (v2.MD5, md5(body))
    props.body_digest.type, props.body_digest.checksum = kind, checksum
    return m


def frames(messages: list[v2.Message]) -> list[ext.ReceiveMessagesResponse]:
    return [
        ext.ReceiveMessagesResponse(messages=ext.Messages(messages=messages)),
        ext.ReceiveMessagesResponse(status=v2.Status(code=v2.OK)),
    ]


def test_a_body_that_does_not_inflate_or_match_its_digest_is_marked_corrupted() -> None:
    text = b"hello " * 100
    packed = gzip.compress(text)
    crc = zlib.crc32(packed)
    good = [
        message("identity", text),
        message("gzip", packed, gzipped=True),  # the digest is of the body as it came, before inflating
        message("two-members", packed + gzip.compress(b"!"), gzipped=True),
        message("lower-case", text, digest=(v2.MD5, md5(text).lower())),
        message("crc-java", packed, gzipped=True, digest=(v2.CRC32, format(crc, "X"))),
        message("crc-python", b"\x00", digest=(v2.CRC32, format(zlib.crc32(b"\x00"), "08X"))),
        message("crc-node", text, digest=(v2.CRC32, str(zlib.crc32(text)))),
        message("sha1", text, digest=(v2.SHA1, hashlib.sha1(text).hexdigest().upper())),
        message("no-digest", text, digest=(v2.DIGEST_TYPE_UNSPECIFIED, "")),
    ]
    bomb = gzip.compress(b"\0" * (_transport.MAX_MESSAGE_BYTES + 1))
    bad = [
        message("not-gzip", b"this is not gzip", gzipped=True),
        message("truncated", packed[: len(packed) // 2], gzipped=True),
        message("garbage", packed[:10] + b"\xff" * 40, gzipped=True),
        message("trailing-garbage", packed + b"junk", gzipped=True),
        message("bomb", bomb, gzipped=True),
        message("md5", text, digest=(v2.MD5, "0" * 32)),
        message("crc32", text, digest=(v2.CRC32, "DEADBEEF")),
        message("sha1-bad", text, digest=(v2.SHA1, "0" * 40)),
    ]
    corrupt: list[tuple[Message, str]] = []
    delivered = _wire.received(frames([*bad[:4], *good, *bad[4:]]), corrupt)
    assert [m.message_id for m in delivered] == [m.system_properties.message_id for m in good]
    assert {m.body for m in delivered} == {text, text + b"!", b"\x00"}
    assert [m.message_id for m, _ in corrupt] == [m.system_properties.message_id for m in bad]
    assert all(m.receipt_handle == f"{m.message_id}@0" and m.topic == "t" for m, _ in corrupt)  # to give back
    whys = dict((m.message_id, why) for m, why in corrupt)
    assert "does not inflate" in whys["truncated"] and "MD5" in whys["md5"]
    assert str(_transport.MAX_MESSAGE_BYTES) in whys["bomb"]
    # Read alone (a give-back of messages nobody waits for), a corrupt message is a message like the others.
    assert _wire.from_v2(bad[0]).message_id == "not-gzip"


def batch(fake: FakeStub) -> list[v2.Message]:
    """m0 and m2 sound; m1's GZIP body does not inflate, m3's body does not match its digest."""
    handles = [fake.message(f"m{i}").receipt_handle for i in range(4)]
    return [
        message("m0", b"body-0", handle=handles[0]),
        message("m1", b"this is not gzip", gzipped=True, handle=handles[1]),
        message("m2", gzip.compress(b"body-2"), gzipped=True, handle=handles[2]),
        message("m3", b"body-3", digest=(v2.MD5, md5(b"other")), handle=handles[3]),
    ]


def assert_given_back_and_logged(fake: FakeStub, delivered: list[Message], caplog: pytest.LogCaptureFixture) -> None:
    assert [(m.message_id, m.body) for m in delivered] == [("m0", b"body-0"), ("m2", b"body-2")]
    assert given_back(fake) == ["m1", "m3"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "m1" in warnings[0] and "m3" in warnings[1]


class BatchStub(SyncStub):
    """ReceiveMessages answers `frames` once; give-backs go to `fake`."""

    def ReceiveMessages(self, request: Any, **_: Any) -> Iterable[Any]:
        return self.answers.pop() if self.answers else frames([])


def test_a_corrupt_message_is_given_back_and_the_rest_of_its_batch_delivered(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeStub()
    with SimpleConsumer("127.0.0.1:1", "g", "t") as consumer:
        stub = BatchStub(fake, frames(batch(fake)))
        consumer._stub = consumer._ext = stub
        delivered = consumer.receive()
    assert_given_back_and_logged(fake, delivered, caplog)


class AsyncBatchStub:
    def __init__(self, fake: FakeStub, answer: list[Any]) -> None:
        self.fake, self.answer = fake, answer

    def ReceiveMessages(self, request: Any, **_: Any) -> AsyncIterator[Any]:
        async def stream() -> AsyncIterator[Any]:
            for frame in self.answer:
                yield frame

        return stream()

    async def ChangeInvisibleDuration(self, request: pb.ChangeInvisibleDurationRequest, **_: Any) -> Any:
        return self.fake.ChangeInvisibleDuration(request)


async def test_an_async_corrupt_message_is_given_back_and_the_rest_of_its_batch_delivered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeStub()
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._channel = FakeChannel()  # type: ignore[assignment]
    consumer._stub_ = consumer._ext_stub_ = AsyncBatchStub(fake, frames(batch(fake)))
    delivered = await consumer.receive()
    await asyncio.wait_for(consumer.close(), 2)
    assert_given_back_and_logged(fake, delivered, caplog)


async def test_a_corrupt_message_on_the_session_is_given_back_and_the_rest_delivered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeStub()
    channel = SessionChannel(fake)
    channel.release.set()
    consumer = aio.SimpleConsumer("127.0.0.1:1", "g", "t")
    consumer._channel = channel  # type: ignore[assignment]
    consumer._stub_ = channel
    receive = asyncio.ensure_future(consumer.receive())
    await asyncio.wait_for(channel.wrote.wait(), 2)
    for frame in frames(batch(fake)):
        channel.answers.put_nowait(ext.SessionResponse(id=channel.written[0].id, receive=frame))
    delivered = await asyncio.wait_for(receive, 2)
    await asyncio.wait_for(consumer.close(), 2)
    assert_given_back_and_logged(fake, delivered, caplog)
