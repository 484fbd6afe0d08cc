"""The v2 system properties a broker stores with each message (Message.v2_system, docs/BROKER.md "Pop answers
for the v2 byte path"): set by its send path whatever the sender put there, kept in the answers to a Pop with
`v2` (the proxy's), cleared in the others (direct callers get the answer they always got) and in admin answers."""

from __future__ import annotations

from pathlib import Path

from popgate_pb import broker_pb2 as pb

from broker import admin, handlers
from broker.metrics import BrokerMetrics
from broker.server import BrokerServicer
from popgate_contract.v2wire import static_system
from tests.unit.broker.cores import broker


async def test_the_send_path_stores_v2_system_properties_a_v2_pop_keeps_and_a_plain_pop_clears(
    tmp_path: Path,
) -> None:
    async with broker(tmp_path) as (core, _):
        sent = [
            pb.Message(topic="t", body=b"a", tag="x", keys=["k"], v2_system=b"made up by the sender"),
            pb.Message(topic="t", body=b"b", message_group="g1"),
            pb.Message(topic="t", body=b"c", priority=3),
        ]
        await handlers.send(core, pb.SendRequest(messages=sent), pb.SendResponse())
        v2 = pb.PopResponse()
        await handlers.pop(core, pb.PopRequest(topic="t", group="a", max_messages=8, invisible_ms=60_000, v2=True), v2)
        plain = pb.PopResponse()
        await handlers.pop(core, pb.PopRequest(topic="t", group="b", max_messages=8, invisible_ms=60_000), plain)
        query = pb.QueryMessagesResponse()
        await admin.query_messages(
            core, pb.QueryMessagesRequest(topic="t", key="k", max_messages=5, with_body=True), query
        )
        servicer = BrokerServicer(core, BrokerMetrics())
        listed = [
            stored
            for queue_id in range(4)
            for stored in (
                await servicer.ListMessages(pb.ListMessagesRequest(topic="t", queue_id=queue_id, limit=10), None)
            ).messages
        ]
    assert [m.stored.message.v2_system for m in query.messages] == [b""]  # nor in admin answers
    assert len(listed) == 3 and all(m.message.v2_system == b"" for m in listed)
    assert len(v2.messages) == len(plain.messages) == 3
    for with_it, without in zip(
        sorted(v2.messages, key=lambda m: m.stored.message.body),
        sorted(plain.messages, key=lambda m: m.stored.message.body),
        strict=True,
    ):
        stored = with_it.stored.message
        assert stored.v2_system == static_system(without.stored.message)  # of the message as stored, never the
        assert without.stored.message.v2_system == b""  # sender's; absent from a plain answer
        assert stored.message_id == without.stored.message.message_id and stored.born_ms > 0
