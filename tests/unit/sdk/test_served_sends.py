"""A producer asks its proxy again for SendShared and the Session once the "not served" is a minute old
(`popgate._served`), also when it only calls send_many (whose planning reads the verdicts too), and marks
SendShared served only when a SendShared was. Fake stubs, no sockets."""

from __future__ import annotations

from typing import Any

import pytest

from popgate import _served, aio
from tests.unit.sdk.fakes import FakeChannel
from tests.unit.sdk.test_send_many import SendStub, Unimplemented, answer, before_shared_sends, producer_with


def test_the_blocking_producers_send_many_asks_again_after_the_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(_served, "clock", lambda: now[0])
    stub, shared = SendStub(), Unimplemented()
    with producer_with(stub, shared) as producer:
        producer.send_many("t", [b"a", b"b"])  # refused: v2 for a minute
        assert shared.events == ["call"]
        for _ in range(3):  # three minutes later, three times
            now[0] += _served.RECHECK_S
            producer.send_many("t", [b"a", b"b"])
    assert shared.events == ["call"] * 4  # once a minute


async def test_the_asyncio_producers_send_many_asks_again_after_the_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(_served, "clock", lambda: now[0])
    kinds: list[str] = []
    producer = before_shared_sends(kinds)
    async with producer:
        await producer.send_many("t", [b"a", b"b"])
        for _ in range(3):
            now[0] += _served.RECHECK_S
            await producer.send_many("t", [b"a", b"b"])
    assert kinds.count("send_shared") == 4


async def test_the_asyncio_producers_send_many_asks_for_the_session_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A proxy without a Session stream: after the minute the next call opens one again."""
    from popgate import _aio_client, _session

    now = [1000.0]
    monkeypatch.setattr(_served, "clock", lambda: now[0])
    opened: list[str] = []

    class NoSession:
        broken = None

        def __init__(self, *a: Any, **k: Any) -> None:
            pass

        async def close(self, *a: Any, **k: Any) -> None:
            return None

        async def aclose(self, *a: Any, **k: Any) -> None:
            return None

        async def request(self, kind: str, request: Any, within_s: float) -> Any:
            opened.append(kind)
            raise _session.Unimplemented("no Session")

    monkeypatch.setattr(_aio_client._session, "Session", NoSession)

    async def send(request: Any, **_: Any) -> Any:
        return answer(request)

    producer = aio.Producer("127.0.0.1:1")
    producer._channel = FakeChannel()  # type: ignore[assignment]
    producer._stub_ = type("Stub", (), {"SendMessage": staticmethod(send)})()
    async with producer:
        await producer.send_many("t", [b"a", b"b"])
        for _ in range(3):
            now[0] += _served.RECHECK_S
            await producer.send_many("t", [b"a", b"b"])
    assert len(opened) == 4


def test_a_v2_send_answered_after_the_minute_does_not_mark_shared_sends_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its answer tells nothing of SendShared: sent as SendMessage, it came a minute after the proxy refused one."""
    from concurrent.futures import Future

    now = [1000.0]
    monkeypatch.setattr(_served, "clock", lambda: now[0])
    events: list[str] = []

    class V2(SendStub):
        def future(self, request: Any, **_: Any) -> Any:
            events.append("v2 sent")
            f: Future[Any] = Future()
            now[0] += _served.RECHECK_S  # the answer comes a minute after the refusal
            f.set_result(answer(request))
            return f

    class Refusing(Unimplemented):
        def future(self, request: Any, **_: Any) -> Any:
            events.append("shared sent")
            return super().future(request)

    stub, shared = V2(), Refusing()
    with producer_with(stub, shared) as producer:
        producer.send_many("t", [b"x"] * 1500, message_group="g")
        assert events[0] == "shared sent" and producer._shared_served is not True
