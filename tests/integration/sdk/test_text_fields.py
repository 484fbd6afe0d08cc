"""Keys, message groups and properties of Unicode text reach a consumer through the proxy on both SDK paths (the
blocking client's v2 SendMessage and `popgate.aio`'s Session stream), and a control character in any of them is
a BadRequest with nothing stored: the proxy's checks and the broker's agree (docs/ARCHITECTURE.md §5)."""

from __future__ import annotations

import pytest

from popgate import BadRequest, Message, Producer, SimpleConsumer, aio
from tests.integration.sdk.conftest import drain, name

TEXT = "促销\u3000活动 a\u00a0b \U0001f468\u200d\U0001f469"  # ideographic space, NBSP, ZWJ: text, not control


def test_unicode_fields_survive_the_blocking_clients_send(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    with Producer(endpoint) as producer, SimpleConsumer(endpoint, group, topic) as consumer:
        producer.send(topic, b"plain", keys=[TEXT], properties={TEXT: TEXT})
        producer.send(topic, b"fifo", message_group=TEXT)
        got = {m.body: m for m in drain(consumer, 2)}
    assert (list(got[b"plain"].keys), dict(got[b"plain"].properties)) == ([TEXT], {TEXT: TEXT})
    assert got[b"fifo"].message_group == TEXT


async def test_unicode_fields_survive_the_session_stream_and_a_control_character_is_refused(endpoint: str) -> None:
    topic, group = name("t"), name("g")
    async with aio.Producer(endpoint) as producer, aio.SimpleConsumer(endpoint, group, topic) as consumer:
        await producer.send(topic, b"plain", keys=[TEXT], properties={TEXT: TEXT})
        await producer.send(topic, b"fifo", message_group=TEXT)
        for fields in ({"keys": ["a\x01"]}, {"message_group": "g\x7f"}, {"properties": {"k": "v\x85"}}):
            with pytest.raises(BadRequest, match="control character"):
                await producer.send(topic, b"refused", **fields)  # type: ignore[arg-type]
        got: dict[bytes, Message] = {}
        while len(got) < 2:
            for m in await consumer.receive(max=8, wait=5):
                got[m.body] = m
                await consumer.ack(m)
        assert await consumer.receive(max=8, wait=0.5) == []  # nothing of a refused send was stored
    plain, fifo = got[b"plain"], got[b"fifo"]
    assert (list(plain.keys), dict(plain.properties)) == ([TEXT], {TEXT: TEXT})
    assert fifo.message_group == TEXT
