"""What text a broker takes in a message's keys, message group and properties: Unicode other than ISO control
characters (C0, DEL, C1) is text, as to the proxy's own checks (tests/unit/proxy/test_rules.py) and RocketMQ's
proxy; a refusal names the field's own error, so a client reads the v2 code of the field."""

from __future__ import annotations

from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as pb

from broker import handlers
from popgate_contract import errors
from tests.unit.broker.cores import broker
from tests.unit.proxy.test_rules import CONTROLS, UNICODE_TEXT


@pytest.mark.parametrize("text", UNICODE_TEXT)
async def test_unicode_text_other_than_control_characters_is_a_key_message_group_or_property(
    tmp_path: Path, text: str
) -> None:
    sent = [
        pb.Message(topic="t", body=b"k", keys=[text, f"注文{text}"]),
        pb.Message(topic="t", body=b"g", message_group=text),
        pb.Message(topic="t", body=b"p", properties={text: text}),
    ]
    async with broker(tmp_path) as (core, _):
        answer = pb.SendResponse()
        await handlers.send(core, pb.SendRequest(messages=sent), answer)
        popped = pb.PopResponse()
        await handlers.pop(
            core, pb.PopRequest(topic="t", group="g", max_messages=8, invisible_ms=60_000, v2=True), popped
        )
    assert len(answer.results) == 3
    got = {m.stored.message.body: m.stored.message for m in popped.messages}
    assert list(got[b"k"].keys) == [text, f"注文{text}"]
    assert got[b"g"].message_group == text
    assert dict(got[b"p"].properties) == {text: text}


@pytest.mark.parametrize("control", CONTROLS)
async def test_a_control_character_is_refused_with_the_fields_own_error_and_nothing_stored(
    tmp_path: Path, control: str
) -> None:
    text = f"a{control}b"
    cases = [
        (pb.Message(topic="t", body=b"x", keys=[text]), errors.IllegalMessageKey),
        (pb.Message(topic="t", body=b"x", message_group=text), errors.IllegalMessageGroup),
        (pb.Message(topic="t", body=b"x", properties={text: "v"}), errors.IllegalPropertyKey),
        (pb.Message(topic="t", body=b"x", properties={"k": text}), errors.IllegalPropertyKey),
    ]
    async with broker(tmp_path) as (core, _):
        for message, error in cases:
            fine = pb.Message(topic="t", body=b"fine")
            with pytest.raises(error, match="control character"):
                await handlers.send(core, pb.SendRequest(messages=[fine, message]), pb.SendResponse())
        popped = pb.PopResponse()
        await handlers.pop(
            core, pb.PopRequest(topic="t", group="g", max_messages=8, invisible_ms=60_000, v2=True), popped
        )
    assert list(popped.messages) == []


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (pb.Message(topic="t", body=b"x", keys=["   "]), errors.IllegalMessageKey),
        (pb.Message(topic="t", body=b"x", message_group="   "), errors.IllegalMessageGroup),
        (pb.Message(topic="t", body=b"x", message_group="g" * 64), errors.IllegalMessageGroup),
        (pb.Message(topic="t", body=b"x", message_group="注" * 21 + "g"), errors.IllegalMessageGroup),  # 64 bytes
    ],
)
async def test_a_blank_key_and_a_blank_or_long_message_group_are_refused_as_by_the_proxy(
    tmp_path: Path, message: pb.Message, error: type[errors.DomainError]
) -> None:
    """The broker checks keys and message groups as the proxy does (`popgate_contract.validation`: a message group
    is 1..63 bytes, neither it nor a key blank), for a client calling it directly too."""
    async with broker(tmp_path) as (core, _):
        with pytest.raises(error):
            await handlers.send(core, pb.SendRequest(messages=[message]), pb.SendResponse())
        answer = pb.SendResponse()
        await handlers.send(
            core, pb.SendRequest(messages=[pb.Message(topic="t", body=b"x", message_group="g" * 63)]), answer
        )
    assert len(answer.results) == 1


async def test_a_blank_message_id_is_refused_and_an_empty_one_is_assigned(tmp_path: Path) -> None:
    """A client calling the broker directly gets the proxy's answer to a blank id (IllegalMessage, the v2
    ILLEGAL_MESSAGE_ID), in a message or a run; an empty id is the broker's to assign."""
    run = pb.SharedRun(shared=pb.Message(topic="t"), bodies=[b"a", b"b"], message_ids=["I1", "   "])
    blank = pb.Message(topic="t", body=b"x", message_id="   ")
    async with broker(tmp_path) as (core, _):
        for request in (pb.SendRequest(messages=[blank]), pb.SendRequest(runs=[run])):
            with pytest.raises(errors.IllegalMessage, match="blank"):
                await handlers.send(core, request, pb.SendResponse())
        answer = pb.SendResponse()
        await handlers.send(core, pb.SendRequest(messages=[pb.Message(topic="t", body=b"x")]), answer)
    assert [bool(r.message_id.strip()) for r in answer.results] == [True]


async def test_the_tag_and_keys_count_toward_the_16_kib_of_properties(tmp_path: Path) -> None:
    """As at the proxy (tests/unit/proxy/test_rules.py): more than 16 KiB of tag, keys and properties in all is
    refused, for a client calling the broker directly too; exactly 16 KiB is stored."""
    keys = ["k" * 256] * 63
    async with broker(tmp_path) as (core, _):
        for message in (
            pb.Message(topic="t", body=b"x", tag="t" * 256, keys=["k" * 256] * 64, properties={"p": "v" * 16000}),
            pb.Message(topic="t", body=b"x", tag="t", keys=["k" * 256] * 64),
            pb.Message(topic="t", body=b"x", tag="t" * 255, keys=keys, properties={"p": "v"}),
        ):
            with pytest.raises(errors.MessagePropertiesTooLarge):
                await handlers.send(core, pb.SendRequest(messages=[message]), pb.SendResponse())
        answer = pb.SendResponse()
        fits = pb.Message(topic="t", body=b"x", tag="t" * 254, keys=keys, properties={"p": "v"})
        await handlers.send(core, pb.SendRequest(messages=[fits]), answer)
    assert len(answer.results) == 1


async def test_a_trace_context_is_stored_and_delivered_and_one_with_a_control_character_refused(
    tmp_path: Path,
) -> None:
    """A client calling the broker directly gets the proxy's checks of a trace context (tests/unit/proxy/
    test_rules.py) and its message back with it."""
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with broker(tmp_path) as (core, _):
        with pytest.raises(errors.BadRequest, match="trace context"):
            bad = pb.Message(topic="t", body=b"x", trace_context="a\x01b")
            await handlers.send(core, pb.SendRequest(messages=[bad]), pb.SendResponse())
        sent = pb.Message(topic="t", body=b"x", trace_context=trace)
        await handlers.send(core, pb.SendRequest(messages=[sent]), pb.SendResponse())
        popped = pb.PopResponse()
        await handlers.pop(core, pb.PopRequest(topic="t", group="g", max_messages=8, invisible_ms=60_000), popped)
    assert [m.stored.message.trace_context for m in popped.messages] == [trace]


@pytest.mark.parametrize("key", ["ORIGIN_TOPIC", "DELIVERY_ATTEMPTS", "ORIGIN_OFFSET", "UNIQ_KEY", "KEYS"])
async def test_a_property_named_as_a_system_one_is_refused(tmp_path: Path, key: str) -> None:
    """RocketMQ's system property names and popgate's dead-letter bookkeeping are not a producer's to set: a dead
    letter would overwrite them and `popgate dlq resend` drop them (ILLEGAL_MESSAGE_PROPERTY_KEY, as RocketMQ's
    proxy). Names that only look alike stay the user's."""
    async with broker(tmp_path) as (core, _):
        with pytest.raises(errors.IllegalPropertyKey, match="used by the system"):
            await handlers.send(core, pb.SendRequest(messages=[system_named(key)]), pb.SendResponse())
        answer = pb.SendResponse()
        await handlers.send(core, pb.SendRequest(messages=[system_named(key.lower()), system_named(f"{key}_")]), answer)
    assert len(answer.results) == 2


def system_named(key: str) -> pb.Message:
    return pb.Message(topic="t", body=b"x", properties={key: "mine"})
