"""The v2 edge without sockets: message conversion, the Telemetry settings reply, ack status."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from popgate_contract.gzip_body import GZIP_MAX_MEMBERS
from popgate_contract.v2wire import static_system
from proxy import validate
from proxy.attempts import GroupAttempts
from proxy.settings import BrokerAddress, Settings
from proxy.v2.ack import _overall
from proxy.v2.convert import SendLimits, client_bytes, seconds, to_broker, to_client
from proxy.v2.send import _response
from proxy.v2.telemetry import settings_reply, telemetry
from tests.unit.proxy.fakes import popped

LIMITS = SendLimits(max_body_bytes=1024, max_delay_s=86400)
NOW = 1_700_000_000.0
SETTINGS = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))


def client_message(**props: object) -> v2.Message:
    message = v2.Message(topic=v2.Resource(name="t"), body=b"payload", user_properties={"a": "1"})
    message.system_properties.message_id = "01ABC"
    message.system_properties.body_encoding = v2.IDENTITY
    for key, value in props.items():
        setattr(message.system_properties, key, value)
    return message


def test_client_message_keeps_id_tag_keys_properties_and_delivery_time() -> None:
    message = client_message(tag="tagA")
    message.system_properties.keys.extend(["k1", "k2"])
    message.system_properties.delivery_timestamp.seconds = int(NOW) + 60
    out = to_broker(message, LIMITS, now_s=NOW)
    assert (out.message_id, out.tag, list(out.keys), dict(out.properties)) == (
        "01ABC",
        "tagA",
        ["k1", "k2"],
        {"a": "1"},
    )
    assert out.deliver_at_ms == (int(NOW) + 60) * 1000


def test_delivery_time_in_milliseconds_by_mistake_is_illegal_delivery_time() -> None:
    message = client_message()
    message.system_properties.delivery_timestamp.seconds = int(NOW * 1000)
    with pytest.raises(errors.IllegalDeliveryTime):
        to_broker(message, LIMITS, now_s=NOW)


def test_a_fifo_message_with_a_future_delivery_time_is_bad_request() -> None:
    """Refused at the edge: a request's message groups go to brokers apart, so a broker's refusal of this one
    would come after the rest of the request was stored."""
    message = client_message(message_group="customer-7")
    message.system_properties.delivery_timestamp.seconds = int(NOW) + 60
    with pytest.raises(errors.BadRequest, match="message_group"):
        to_broker(message, LIMITS, now_s=NOW)
    message.system_properties.delivery_timestamp.seconds = int(NOW) - 60  # already due: an ordinary FIFO message
    assert to_broker(message, LIMITS, now_s=NOW).message_group == "customer-7"


def test_a_delivery_time_already_past_is_kept_so_the_consumer_gets_it_back() -> None:
    """RocketMQ hands the consumer the delivery_timestamp its producer set; it was dropped when already past."""
    message = client_message()
    message.system_properties.delivery_timestamp.seconds = int(NOW) - 100
    out = to_broker(message, LIMITS, now_s=NOW)
    assert out.deliver_at_ms == (int(NOW) - 100) * 1000
    delivered = popped("b1", "id-1")
    delivered.stored.message.CopyFrom(out)
    assert to_client(delivered).system_properties.delivery_timestamp.seconds == int(NOW) - 100


def test_gzip_bodies_are_inflated_and_their_size_checked_after_inflating() -> None:
    message = client_message(body_encoding=v2.GZIP)
    message.body = gzip.compress(b"z" * 1000)
    assert to_broker(message, LIMITS, now_s=NOW).body == b"z" * 1000
    message.body = gzip.compress(b"z" * 5000)
    with pytest.raises(errors.MessageBodyTooLarge):
        to_broker(message, LIMITS, now_s=NOW)


def test_gzip_bodies_must_be_whole_and_may_have_several_members() -> None:
    message = client_message(body_encoding=v2.GZIP)
    message.body = gzip.compress(b"a" * 500) + gzip.compress(b"b" * 400)
    assert to_broker(message, LIMITS, now_s=NOW).body == b"a" * 500 + b"b" * 400
    for damaged in (gzip.compress(b"z" * 1000)[:-12], gzip.compress(b"z" * 10) + b"junk"):
        message.body = damaged
        with pytest.raises(errors.BadRequest, match="GZIP"):
            to_broker(message, LIMITS, now_s=NOW)
    message.body = gzip.compress(b"a" * 600) + gzip.compress(b"b" * 600)  # each member fits, both do not
    with pytest.raises(errors.MessageBodyTooLarge):
        to_broker(message, LIMITS, now_s=NOW)


def test_lite_messages_are_unsupported_not_stored_as_normal_ones() -> None:
    with pytest.raises(errors.Unsupported, match="LITE"):
        to_broker(client_message(message_type=v2.LITE), LIMITS, now_s=NOW)
    for kind in (v2.MESSAGE_TYPE_UNSPECIFIED, v2.NORMAL, v2.FIFO, v2.DELAY, v2.PRIORITY):
        assert to_broker(client_message(message_type=kind), LIMITS, now_s=NOW).body == b"payload"
    assert to_broker(client_message(message_type=v2.TRANSACTION), LIMITS, now_s=NOW).transactional


def test_a_priority_goes_to_the_broker_and_back_and_a_negative_or_mixed_one_is_refused() -> None:
    message = client_message(message_type=v2.PRIORITY)
    message.system_properties.priority = 7
    assert to_broker(message, LIMITS, now_s=NOW).priority == 7
    message.system_properties.priority = -1
    with pytest.raises(errors.BadRequest, match="negative"):
        to_broker(message, LIMITS, now_s=NOW)
    message.system_properties.priority = 3
    message.system_properties.message_group = "g"
    with pytest.raises(errors.BadRequest, match="PRIORITY"):
        to_broker(message, LIMITS, now_s=NOW)


def test_popped_message_has_handle_attempt_identity_encoding_and_md5_digest() -> None:
    out = to_client(popped("b1", "id-1", body=b"hello", attempt=2))
    props = out.system_properties
    assert props.receipt_handle.startswith("1~b1~") and props.delivery_attempt == 2
    assert props.body_encoding == v2.IDENTITY
    # upper-case hex, as RocketMQ's proxy sends it and every official client compares it
    assert (props.body_digest.type, props.body_digest.checksum) == (v2.MD5, "5D41402ABC4B2A76B9719D911017C592")
    assert props.store_timestamp.seconds == 1_700_000_000 and props.store_timestamp.nanos == 123_000_000
    assert props.message_type == v2.NORMAL and out.body == b"hello"


TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_trace_context_is_stored_and_given_back_on_delivery_by_either_path() -> None:
    """As RocketMQ keeps a producer's trace_context (property TRACE_CONTEXT) and returns it on each delivery; a
    message sent without one is delivered without one; one with a control character is refused."""
    for sent, field in ((TRACE, TRACE), (None, None)):
        message = client_message() if sent is None else client_message(trace_context=sent)
        stored = to_broker(message, LIMITS, now_s=NOW)
        delivery = popped("b1", "id-1")
        delivery.stored.message.CopyFrom(stored)
        delivery.stored.message.v2_system = static_system(stored)
        for props in (
            to_client(delivery).system_properties,
            v2.Message.FromString(client_bytes(delivery)).system_properties,
        ):
            assert (props.trace_context if props.HasField("trace_context") else None) == field
    with pytest.raises(errors.BadRequest, match="trace context"):
        to_broker(client_message(trace_context="00-a\n"), LIMITS, now_s=NOW)


def test_absurd_durations_are_bad_requests() -> None:
    from google.protobuf.duration_pb2 import Duration

    with pytest.raises(errors.BadRequest):
        seconds(Duration(seconds=10**15), what="x")


def test_producer_settings_reply_is_ok_with_the_body_limit_and_metrics_off() -> None:
    client = v2.Settings(client_type=v2.PRODUCER, publishing=v2.Publishing(max_body_size=134217728))
    client.metric.on = True
    reply = settings_reply(client, SETTINGS)
    assert reply.status.code == v2.OK
    assert reply.settings.publishing.max_body_size == 4 * 1024 * 1024
    assert reply.settings.publishing.validate_message_type and not reply.settings.metric.on


def test_consumer_settings_reply_sets_long_polling_batch_and_retry_backoff() -> None:
    client = v2.Settings(client_type=v2.PUSH_CONSUMER, subscription=v2.Subscription(group=v2.Resource(name="g")))
    reply = settings_reply(client, SETTINGS).settings
    assert reply.subscription.long_polling_timeout.seconds == 20
    assert reply.subscription.receive_batch_size == 32 and not reply.subscription.fifo
    assert reply.backoff_policy.max_attempts == 17
    assert reply.backoff_policy.customized_backoff.next[0].seconds == 1
    assert settings_reply(client, SETTINGS, max_attempts=3).settings.backoff_policy.max_attempts == 3


def test_settings_reply_says_fifo_for_the_configured_groups_only_namespace_included() -> None:
    settings = Settings(brokers=SETTINGS.brokers, fifo_groups=("orders", "tenant%billing"))

    def fifo(name: str, namespace: str = "") -> bool:
        group = v2.Resource(name=name, resource_namespace=namespace)
        client = v2.Settings(client_type=v2.PUSH_CONSUMER, subscription=v2.Subscription(group=group))
        return settings_reply(client, settings).settings.subscription.fifo

    assert fifo("orders") and fifo("billing", "tenant")
    assert not fifo("billing") and not fifo("orders", "tenant") and not fifo("other") and not fifo("bad name!")


def entry(code: int) -> pb.AckMessageResultEntry:
    return pb.AckMessageResultEntry(status=v2.Status(code=code))  # type: ignore[arg-type]


def test_ack_status_is_ok_the_shared_error_or_multiple_results_never_message_not_found() -> None:
    assert _overall([entry(v2.OK), entry(v2.OK)]).code == v2.OK
    assert _overall([entry(v2.INVALID_RECEIPT_HANDLE)]).code == v2.INVALID_RECEIPT_HANDLE
    assert _overall([entry(v2.OK), entry(v2.INVALID_RECEIPT_HANDLE)]).code == v2.MULTIPLE_RESULTS


def test_a_gzip_body_of_thousands_of_members_is_refused_without_inflating_them_all() -> None:
    limits = SendLimits(max_body_bytes=64 * 1024, max_delay_s=86400)
    message = client_message(body_encoding=v2.GZIP)
    empty = gzip.compress(b"")
    message.body = gzip.compress(b"a") + empty * (GZIP_MAX_MEMBERS + 1)  # ~1.3 KB: within the body limit
    with pytest.raises(errors.BadRequest, match="members"):
        to_broker(message, limits, now_s=NOW)
    message.body = gzip.compress(b"a") + empty * (GZIP_MAX_MEMBERS - 1)
    assert to_broker(message, limits, now_s=NOW).body == b"a"
    message.body = empty * 200_000  # 4 MB of members, far over the limit even compressed: refused at once
    with pytest.raises(errors.MessageBodyTooLarge):
        to_broker(message, limits, now_s=NOW)


async def test_an_absurd_invisible_duration_is_illegal_invisible_time_not_bad_request() -> None:
    from google.protobuf.duration_pb2 import Duration

    from proxy.settings import BrokerAddress, Settings
    from proxy.v2.context import Call, endpoints_for
    from proxy.v2.receive import build_request

    call = Call(None, Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),)), endpoints_for("127.0.0.1:1"), None)  # type: ignore[arg-type]
    request = pb.ReceiveMessageRequest(
        group=v2.Resource(name="g"), batch_size=1, invisible_duration=Duration(seconds=10**9)
    )
    request.message_queue.topic.name = "t"
    with pytest.raises(errors.IllegalInvisibleTime):
        build_request(call, request)


async def test_a_session_receive_may_ask_for_joined_receives_and_a_v2_one_for_max_batch() -> None:
    from proxy.settings import BrokerAddress, Settings
    from proxy.v2.context import Call, endpoints_for
    from proxy.v2.receive import JOINED_RECEIVES, build_request

    settings = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    call = Call(None, settings, endpoints_for("127.0.0.1:1"), None)  # type: ignore[arg-type]
    request = pb.ReceiveMessageRequest(group=v2.Resource(name="g"), batch_size=settings.max_batch + 1)
    request.message_queue.topic.name = "t"
    with pytest.raises(errors.IllegalBatchSize, match=f"1..{settings.max_batch}"):
        build_request(call, request)
    request.batch_size = settings.max_batch * JOINED_RECEIVES
    asked = build_request(call, request, max_fifo=settings.max_batch)
    assert (asked.batch, asked.pop_request(0).max_fifo) == (request.batch_size, settings.max_batch)
    with pytest.raises(errors.IllegalBatchSize):  # one that does not say one receive's batch stands for one
        build_request(call, request)
    request.batch_size += 1
    with pytest.raises(errors.IllegalBatchSize):
        build_request(call, request, max_fifo=settings.max_batch)
    request.batch_size = 1
    for max_fifo in (settings.max_batch + 1, 2**32 - 1):  # a uint32 the broker's int32 would not hold: refused here
        with pytest.raises(errors.BadRequest, match="max_fifo"):
            build_request(call, request, max_fifo=max_fifo)


@pytest.mark.parametrize(("seconds", "nanos"), [(2**62, 0), (253402300799, 1_000_000_000), (1_764_000_000, -5)])
def test_a_born_timestamp_that_is_no_time_is_a_bad_request_not_an_internal_error(seconds: int, nanos: int) -> None:
    """Out of range nanos too: added as whole seconds they stored a time 1 s past the last valid Timestamp, which a
    consumer's protobuf refuses to read."""
    message = client_message()
    message.system_properties.born_timestamp.seconds = seconds
    message.system_properties.born_timestamp.nanos = nanos
    with pytest.raises(errors.BadRequest, match="born_timestamp"):
        to_broker(message, LIMITS, now_s=NOW)


def test_settings_reply_does_not_echo_the_clients_lists_or_user_agent() -> None:
    """A client that never reads its replies keeps them queued: an echo of 8 MB of topics cost 24 MB a stream."""
    topics = [v2.Resource(name=f"topic-{i}") for i in range(10_000)]
    producer = v2.Settings(client_type=v2.PRODUCER, publishing=v2.Publishing(topics=topics))
    producer.user_agent.hostname = "h" * 100_000
    entries = [v2.SubscriptionEntry(topic=t) for t in topics]
    consumer = v2.Settings(
        client_type=v2.SIMPLE_CONSUMER, subscription=v2.Subscription(group=v2.Resource(name="g"), subscriptions=entries)
    )
    for client in (producer, consumer):
        reply = settings_reply(client, SETTINGS).settings
        assert reply.ByteSize() < 1024, reply.ByteSize()
        assert reply.WhichOneof("pub_sub") == client.WhichOneof("pub_sub") and reply.client_type == client.client_type


async def test_settings_larger_than_the_limit_get_bad_request_and_the_stream_goes_on() -> None:
    huge = v2.Settings(client_type=v2.PRODUCER, publishing=v2.Publishing(topics=[v2.Resource(name="t" * 100)] * 1000))
    small = v2.Settings(client_type=v2.PRODUCER, publishing=v2.Publishing())

    async def commands() -> AsyncIterator[pb.TelemetryCommand]:
        yield pb.TelemetryCommand(settings=huge)
        yield pb.TelemetryCommand(settings=small)

    attempts = GroupAttempts(lambda: [], timeout_s=1.0)
    refused, answered = [reply async for reply in telemetry(commands(), SETTINGS, asyncio.Event(), attempts)]
    assert refused.status.code == v2.BAD_REQUEST and "at most 65536" in refused.status.message
    assert answered.status.code == v2.OK and answered.settings.publishing.max_body_size == 4 * 1024 * 1024


@pytest.mark.parametrize(("seconds", "nanos"), [(-(2**62), 0), (-(10**16), 0), (-1, 0), (int(NOW), 2 * 10**9)])
def test_a_delivery_timestamp_that_is_no_time_is_illegal_delivery_time_not_an_internal_error(
    seconds: int, nanos: int
) -> None:
    message = client_message()
    message.system_properties.delivery_timestamp.seconds = seconds
    message.system_properties.delivery_timestamp.nanos = nanos
    with pytest.raises(errors.IllegalDeliveryTime, match="is not a time"):
        to_broker(message, LIMITS, now_s=NOW)


def test_an_unknown_body_encoding_or_message_type_is_refused_by_its_number() -> None:
    with pytest.raises(errors.BadRequest, match="body_encoding 99 is not one the proxy reads"):
        to_broker(client_message(body_encoding=99), LIMITS, now_s=NOW)
    assert to_broker(client_message(body_encoding=v2.ENCODING_UNSPECIFIED), LIMITS, now_s=NOW).body == b"payload"
    with pytest.raises(errors.Unsupported, match="^message_type 77: messages are not supported"):
        to_broker(client_message(message_type=77), LIMITS, now_s=NOW)


def test_an_invisible_time_just_under_the_minimum_is_not_shown_as_the_minimum() -> None:
    with pytest.raises(errors.IllegalInvisibleTime, match=r"9\.999999999 s is out of range: must be 10 s\.\."):
        validate.invisible(9.999999999, low=10, high=43200)


def test_empty_tag_or_group_is_refused_other_defaults_store_as_unset() -> None:
    """Set to "", a tag or a message group is refused where unset is not; a born or delivery time of 0 s, a
    priority of 0 and no keys store what leaving them out stores."""
    plain = to_broker(client_message(), LIMITS, now_s=NOW)
    assert plain == bpb.Message(topic="t", message_id="01ABC", body=b"payload", properties={"a": "1"})
    assert not plain.HasField("tag")
    for field, error in (("tag", errors.IllegalMessageTag), ("message_group", errors.IllegalMessageGroup)):
        with pytest.raises(error):
            to_broker(client_message(**{field: ""}), LIMITS, now_s=NOW)
    defaults = client_message(priority=0)
    defaults.system_properties.born_timestamp.SetInParent()
    defaults.system_properties.delivery_timestamp.SetInParent()
    assert to_broker(defaults, LIMITS, now_s=NOW) == plain
    fifo = client_message(message_group="g", born_host="h" * 300)
    fifo.system_properties.delivery_timestamp.SetInParent()  # 0 s: due at once, not a delay
    fifo.system_properties.born_timestamp.nanos = 999_999  # under a millisecond: born on the second
    fifo.system_properties.born_timestamp.seconds = 7
    assert to_broker(fifo, LIMITS, now_s=NOW) == bpb.Message(
        topic="t",
        message_id="01ABC",
        body=b"payload",
        properties={"a": "1"},
        message_group="g",
        born_host="h" * 256,
        born_ms=7000,
    )


def test_a_requests_messages_share_their_topic_checks_and_a_refused_topic_fails_each_message_alike() -> None:
    topics: dict[tuple[str, str], str] = {}
    first, second = client_message(), client_message()
    for message in (first, second):
        message.topic.resource_namespace = "tenant"
    assert [to_broker(m, LIMITS, now_s=NOW, topics=topics).topic for m in (first, second)] == ["tenant%t"] * 2
    bare = client_message()
    assert to_broker(bare, LIMITS, now_s=NOW, topics=topics).topic == "t"
    system = client_message()
    system.topic.name = "TBW102"
    refusals = []
    for _ in range(2):
        with pytest.raises(errors.IllegalTopic) as caught:
            to_broker(system, LIMITS, now_s=NOW, topics=topics)
        refusals.append(caught.value.message)
    assert refusals == ["topic 'TBW102' is a system topic: messages cannot be sent to it"] * 2
    assert topics == {("tenant", "t"): "tenant%t", ("", "t"): "t"}


def test_send_entries_are_each_messages_result_or_its_failure() -> None:
    """Stored: OK with what the broker answered (the message's own id when the broker gave none); not stored: the
    failure's status and the message's id. The same bytes as entries built one by one."""
    ok = v2.Status(code=v2.OK, message="OK")
    failed = v2.Status(code=v2.PROXY_TIMEOUT, message="broker b2 did not answer in time")
    status = v2.Status(code=v2.PROXY_TIMEOUT, message="2 of 3 stored (see entries): broker b2 did not answer in time")
    results = [
        bpb.SendResult(message_id="B0", offset=4, recall_handle="r0", transaction_id="x0"),
        None,
        bpb.SendResult(offset=0),
    ]
    response = _response(status, failed, results, [f"M{i}" for i in range(3)])
    expected = pb.SendMessageResponse(
        status=status,
        entries=[
            pb.SendResultEntry(status=ok, message_id="B0", offset=4, recall_handle="r0", transaction_id="x0"),
            pb.SendResultEntry(status=failed, message_id="M1"),
            pb.SendResultEntry(status=ok, message_id="M2"),
        ],
    )
    assert response == expected
    assert response.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)
