"""Every check of docs/ARCHITECTURE.md §5 through a real proxy: the v2 code, a message saying what, nothing stored."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator

import grpc
import pytest
from popgate_pb import broker_pb2 as bpb
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate.cli.admin import Broker, fetch_stats
from popgate.cli.cluster import Cluster, ClusterConfig
from tests.integration.proxy.client import V2Client

RESERVE_S = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # The proxy keeps 4 s of a receive's deadline to answer: a deadline of 3 s leaves it no time to poll, and the
    # refusal has seconds to reach the client however loaded the machine.
    config = ClusterConfig(
        brokers=1,
        listen="127.0.0.1:0",
        data_dir=tmp_path_factory.mktemp("bad"),
        metrics=True,
        proxy_args=("--poll-reserve-s", str(RESERVE_S)),
    )
    with Cluster(config) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[V2Client]:
    client = V2Client(cluster.endpoint)
    try:
        yield client
    finally:
        client.close()


def stored(cluster: Cluster) -> tuple[int, int]:
    """What the broker holds: messages stored in any queue, and scheduled messages waiting."""
    [(name, broker)] = cluster.brokers.items()
    stats = fetch_stats([Broker(name, broker.address)], bpb.StatsRequest(), timeout=5)[name]
    text = urllib.request.urlopen(broker.metrics_url, timeout=5).read().decode()
    gauge = "popgate_broker_scheduled_messages "
    [scheduled] = [line.split()[1] for line in text.splitlines() if line.startswith(gauge)]
    return sum(q.max_offset for q in stats.queues), int(float(scheduled))


def message(topic: str = "bad", body: bytes = b"x", **props: object) -> v2.Message:
    out = v2.Message(topic=v2.Resource(name=topic), body=body)
    out.system_properties.message_id = "01AB"
    out.system_properties.body_encoding = v2.IDENTITY
    for key, value in props.items():
        setattr(out.system_properties, key, value)
    return out


def receive(topic: str = "bad", group: str = "g", **fields: object) -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic)),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=16,
    )
    request.invisible_duration.seconds = 30
    request.long_polling_timeout.seconds = 1
    for key, value in fields.items():
        if key == "invisible_s":
            request.invisible_duration.seconds = value  # type: ignore[assignment]
        elif key == "poll_s":
            request.long_polling_timeout.seconds = value  # type: ignore[assignment]
        elif key == "sql":
            request.filter_expression.type = v2.SQL
        else:
            setattr(request, key, value)
    return request


def send_status(client: V2Client, *messages: v2.Message) -> v2.Status:
    return client.stub.SendMessage(pb.SendMessageRequest(messages=messages), timeout=10).status


def receive_status(client: V2Client, request: pb.ReceiveMessageRequest, timeout_s: float = 5) -> v2.Status:
    return list(client.stub.ReceiveMessage(request, timeout=timeout_s))[-1].status


def delivery_in_ms() -> v2.Message:
    out = message()
    out.system_properties.delivery_timestamp.seconds = int(time.time() * 1000)  # ms by mistake
    return out


def fifo_delayed() -> v2.Message:
    out = message(message_group="customer-7")
    out.system_properties.delivery_timestamp.seconds = int(time.time()) + 60
    return out


def route_status(client: V2Client, addresses: int) -> v2.Status:
    request = pb.QueryRouteRequest(topic=v2.Resource(name="bad"))
    request.endpoints.addresses.extend([v2.Address(host="h" * 200, port=8081)] * addresses)
    return client.stub.QueryRoute(request, timeout=5).status


CASES: list[tuple[str, Callable[[V2Client], v2.Status], int, str]] = [
    ("body too large", lambda c: send_status(c, message(body=b"x" * (4 * 1024 * 1024 + 1))),
     v2.MESSAGE_BODY_TOO_LARGE, "limit is 4194304 bytes"),
    ("empty body", lambda c: send_status(c, message(body=b"")), v2.MESSAGE_BODY_EMPTY, "empty"),
    ("bad topic", lambda c: send_status(c, message(topic="no spaces")), v2.ILLEGAL_TOPIC, "may only contain"),
    ("long topic", lambda c: send_status(c, message(topic="t" * 128)), v2.ILLEGAL_TOPIC, "limit is 127"),
    ("to a dead-letter queue", lambda c: send_status(c, message(topic="%DLQ%g")), v2.ILLEGAL_TOPIC, "system topic"),
    ("bad tag", lambda c: send_status(c, message(tag="a|b")), v2.ILLEGAL_MESSAGE_TAG, "contains '|'"),
    ("delivery in ms", lambda c: send_status(c, delivery_in_ms()), v2.ILLEGAL_DELIVERY_TIME, "not milliseconds"),
    ("delayed FIFO message", lambda c: send_status(c, message(), fifo_delayed()), v2.BAD_REQUEST, "message_group"),
    ("endless endpoints", lambda c: route_status(c, 1000), v2.BAD_REQUEST, "at most 16"),
    ("poll of centuries", lambda c: receive_status(c, receive(poll_s=400 * 365 * 86400)), v2.ILLEGAL_POLLING_TIME,
     "not a valid duration"),
    ("bad group", lambda c: receive_status(c, receive(group="g/1")), v2.ILLEGAL_CONSUMER_GROUP, "may only contain"),
    ("batch 33", lambda c: receive_status(c, receive(batch_size=33)), v2.BAD_REQUEST, "must be 1..32"),
    ("batch 0", lambda c: receive_status(c, receive(batch_size=0)), v2.BAD_REQUEST, "must be 1..32"),
    ("invisible 5 s", lambda c: receive_status(c, receive(invisible_s=5)), v2.ILLEGAL_INVISIBLE_TIME, "10 s..43200 s"),
    ("sql filter", lambda c: receive_status(c, receive(sql=True)), v2.ILLEGAL_FILTER_EXPRESSION, "SQL92"),
    ("deadline too short", lambda c: receive_status(c, receive(poll_s=0), timeout_s=3), v2.ILLEGAL_POLLING_TIME,
     "raise the client's request timeout"),
    ("deadline shorter than the poll", lambda c: receive_status(c, receive(poll_s=10), timeout_s=3),
     v2.TOO_MANY_REQUESTS, "proxy is behind"),
    ("garbage handle", lambda c: c.stub.AckMessage(pb.AckMessageRequest(
        group=v2.Resource(name="g"), topic=v2.Resource(name="bad"),
        entries=[pb.AckMessageEntry(receipt_handle="junk")]), timeout=5).status,
     v2.INVALID_RECEIPT_HANDLE, "malformed"),
    ("unknown broker", lambda c: c.stub.ChangeInvisibleDuration(pb.ChangeInvisibleDurationRequest(
        group=v2.Resource(name="g"), topic=v2.Resource(name="bad"),
        receipt_handle="1~b9~bad~0~0~1~ab~1700000000000"), timeout=5).status,
     v2.INVALID_RECEIPT_HANDLE, "does not know"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "call", "code", "text"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_gets_its_code_and_a_clear_message_and_stores_nothing(
    cluster: Cluster, client: V2Client, case: str, call: Callable[[V2Client], v2.Status], code: int, text: str
) -> None:
    before = stored(cluster)
    try:
        status = call(client)
    except grpc.RpcError as exc:
        pytest.fail(f"{case}: gRPC error instead of a v2 status: {exc}")
    assert (v2.Code.Name(status.code), text in status.message) == (v2.Code.Name(code), True), status  # type: ignore[arg-type]
    assert stored(cluster) == before  # no message and no scheduled message


def test_a_refused_change_of_invisibility_gives_back_the_handle_it_was_sent(client: V2Client) -> None:
    # The official client stores the answer's receipt_handle in the message before it checks the status.
    handle = "1~nobroker~bad~0~5~1~ab~1700000000000"
    request = pb.ChangeInvisibleDurationRequest(
        group=v2.Resource(name="g"), topic=v2.Resource(name="bad"), receipt_handle=handle, message_id="m"
    )
    request.invisible_duration.seconds = 10
    response = client.stub.ChangeInvisibleDuration(request, timeout=5)
    assert response.status.code != v2.OK
    assert response.receipt_handle == handle


def test_a_handle_too_long_to_be_one_is_not_echoed_so_the_client_can_read_why(cluster: Cluster) -> None:
    """Echoed, 10 MB of it made the answer larger than a client reads by default (4 MiB): a bare gRPC
    RESOURCE_EXHAUSTED instead of the v2 status."""
    client = V2Client(cluster.endpoint, options=[("grpc.max_send_message_length", 16 << 20)])
    try:
        request = pb.ChangeInvisibleDurationRequest(
            group=v2.Resource(name="g"), topic=v2.Resource(name="bad"), receipt_handle="x" * 10_000_000, message_id="m"
        )
        request.invisible_duration.seconds = 10
        response = client.stub.ChangeInvisibleDuration(request, timeout=10)
    finally:
        client.close()
    assert response.status.code == v2.INVALID_RECEIPT_HANDLE and "longer than 1024" in response.status.message
    assert response.receipt_handle == ""


def test_an_ack_of_a_handle_too_long_to_be_one_does_not_echo_it_so_the_client_can_read_why(cluster: Cluster) -> None:
    """As ChangeInvisibleDuration: each failed entry echoes its handle and message id, but not one longer than a
    handle or a message id can be."""
    client = V2Client(cluster.endpoint, options=[("grpc.max_send_message_length", 16 << 20)])
    handle = "1~nobroker~bad~0~5~1~ab~1700000000000"
    try:
        request = pb.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="bad"))
        request.entries.add(message_id="m1", receipt_handle="x" * 5_000_000)
        request.entries.add(message_id="m2", receipt_handle=handle)
        request.entries.add(message_id="i" * 5_000_000, receipt_handle=handle)
        response = client.stub.AckMessage(request, timeout=10)
    finally:
        client.close()
    assert response.status.code == v2.INVALID_RECEIPT_HANDLE
    [long, short, long_id] = response.entries
    assert (long.message_id, long.receipt_handle) == ("m1", "")
    assert long.status.code == v2.INVALID_RECEIPT_HANDLE and "longer than 1024" in long.status.message
    assert (short.message_id, short.receipt_handle) == ("m2", handle)
    assert (long_id.message_id, long_id.receipt_handle) == ("", handle)


def test_an_ack_of_many_handles_of_wide_characters_is_answered_in_a_size_the_client_reads(cluster: Cluster) -> None:
    """1,024 entries, each a handle of 4-byte characters within 1,024 characters (a made-up broker name) and a
    message id within 128: echoed whole, with the name in each status, the answer was 8.7 MB."""
    client = V2Client(cluster.endpoint, options=[("grpc.max_send_message_length", 64 << 20)])
    handle = f"1~{chr(0x1F600) * 990}~t~0~5~1~ab~1700000000000"
    try:
        request = pb.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="t"))
        for _ in range(1024):
            request.entries.add(message_id=chr(0x1F600) * 128, receipt_handle=handle)
        response = client.stub.AckMessage(request, timeout=20)
    finally:
        client.close()
    assert response.status.code == v2.INVALID_RECEIPT_HANDLE and response.ByteSize() < 4 << 20


def receives_counted(cluster: Cluster, outcome: str) -> float:
    text = urllib.request.urlopen(cluster.proxies[0].metrics_url, timeout=5).read().decode()
    prefix = f'popgate_proxy_receives_total{{group="g",mode="adaptive",outcome="{outcome}"}} '
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def test_receives_refused_for_want_of_time_show_in_the_proxy_receive_metrics(
    cluster: Cluster, client: V2Client
) -> None:
    # Answered before they reached a receive strategy, they were not counted at all. Counted under g's own label
    # once a broker served one of its receives (refused ones give a group none).
    assert receive_status(client, receive()).code in (v2.OK, v2.MESSAGE_NOT_FOUND)
    before = receives_counted(cluster, "behind"), receives_counted(cluster, "illegal_polling_time")
    assert receive_status(client, receive(poll_s=10), timeout_s=3).code == v2.TOO_MANY_REQUESTS
    assert receive_status(client, receive(poll_s=0), timeout_s=3).code == v2.ILLEGAL_POLLING_TIME
    after = receives_counted(cluster, "behind"), receives_counted(cluster, "illegal_polling_time")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
