"""Generated requests to every MessagingService RPC: the proxy never crashes and always answers a v2 status."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from sdk.cluster import Cluster, ClusterConfig

CODES = set(v2.Code.values())
HANDLE = "1~b1~fuzz~0~0~1~ab~1700000000000"
TEXT = st.one_of(
    st.sampled_from(["", "fuzz", "g1", "*", "a||b", "%DLQ%g1", "b1", HANDLE, "x" * 200, "bad name", "\x00"]),
    st.text(max_size=40),
)
BYTES = st.one_of(st.binary(max_size=64), st.just(b"x" * (4 * 1024 * 1024 + 1)))
INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
}


def values(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    if kind == FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 70000))
    if kind == FieldDescriptor.TYPE_STRING:
        return TEXT
    if kind == FieldDescriptor.TYPE_BYTES:
        return BYTES
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(allow_nan=False, width=32)
    low, high = INT_RANGES.get(kind, (-(2**31), 2**31 - 1))
    return st.one_of(st.integers(-3, 40), st.integers(low, high))


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    if depth > 4:
        return st.just({})
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            optional[field.name] = st.dictionaries(TEXT, TEXT, max_size=3)
        elif field.is_repeated:  # type: ignore[attr-defined]
            optional[field.name] = st.lists(values(field, depth), max_size=3)
        else:
            optional[field.name] = values(field, depth)
    return st.fixed_dictionaries({}, optional=optional)  # type: ignore[arg-type]


def build(cls: type[Message], data: dict[str, Any]) -> Message:
    message = cls()
    for name, value in data.items():  # set one by one: later oneof members simply win
        field = cls.DESCRIPTOR.fields_by_name[name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(message, name).update(value)
        elif field.is_repeated:  # type: ignore[attr-defined]
            if field.message_type is not None:
                for item in value:
                    getattr(message, name).append(build(GetMessageClass(field.message_type), item))
            else:
                getattr(message, name).extend(value)
        elif field.message_type is not None:
            getattr(message, name).CopyFrom(build(GetMessageClass(field.message_type), value))
        else:
            setattr(message, name, value)
    return message


def requests(cls: type[Message]) -> st.SearchStrategy[Message]:
    return messages(cls.DESCRIPTOR).map(lambda d: build(cls, d))


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pb_grpc.MessagingServiceStub]:
    # Short long polls so generated receives answer quickly.
    args = ("--max-long-polling-s", "0.3", "--default-long-polling-s", "0.2", "--poll-reserve-s", "0.05")
    cluster = Cluster(
        ClusterConfig(brokers=1, listen="127.0.0.1:0", data_dir=tmp_path_factory.mktemp("fz"), proxy_args=args)
    )
    cluster.start()
    channel = grpc.insecure_channel(cluster.endpoint, options=[("grpc.max_send_message_length", -1)])
    try:
        yield pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]
    finally:
        channel.close()
        cluster.stop()
    proxy_child = cluster.proxies[0]
    assert proxy_child.process is not None and proxy_child.process.returncode == 0, "proxy did not stop cleanly"
    log = proxy_child.log_path.read_text()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]


UNARY = ["QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "AckMessage", "ForwardMessageToDeadLetterQueue",
         "UpdateOffset", "GetOffset", "QueryOffset", "EndTransaction", "NotifyClientTermination",
         "ChangeInvisibleDuration", "RecallMessage", "SyncLiteSubscription"]  # fmt: skip
FUZZ = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("method", UNARY)
def test_unary_rpcs_answer_a_v2_status_for_any_request(proxy: pb_grpc.MessagingServiceStub, method: str) -> None:
    request_cls = getattr(pb, f"{method}Request")

    @FUZZ
    @given(requests(request_cls))
    def check(request: Message) -> None:
        response = getattr(proxy, method)(request, timeout=10)
        assert response.status.code in CODES and response.status.code != v2.CODE_UNSPECIFIED, response.status

    check()


def test_receive_message_streams_end_with_a_v2_status(proxy: pb_grpc.MessagingServiceStub) -> None:
    @FUZZ
    @given(requests(pb.ReceiveMessageRequest))
    def check(request: Message) -> None:
        frames = list(proxy.ReceiveMessage(request, timeout=10))
        assert frames and frames[-1].HasField("status") and frames[-1].status.code in CODES

    check()


def test_pull_message_answers_not_implemented(proxy: pb_grpc.MessagingServiceStub) -> None:
    frames = list(proxy.PullMessage(pb.PullMessageRequest(), timeout=5))
    assert [f.status.code for f in frames] == [v2.NOT_IMPLEMENTED]


def test_telemetry_answers_settings_and_survives_any_command(proxy: pb_grpc.MessagingServiceStub) -> None:
    @FUZZ
    @given(st.lists(requests(pb.TelemetryCommand), min_size=1, max_size=3))
    def check(commands: list[Message]) -> None:
        replies = list(proxy.Telemetry(iter(commands), timeout=10))
        wanted = sum(1 for c in commands if c.HasField("settings"))
        assert len(replies) == wanted
        assert all(r.status.code == v2.OK and r.settings.ByteSize() >= 0 for r in replies)

    check()


def test_the_proxy_still_serves_after_the_fuzzing(proxy: pb_grpc.MessagingServiceStub) -> None:
    route = proxy.QueryRoute(pb.QueryRouteRequest(topic=v2.Resource(name="after")), timeout=5)
    assert route.status.code == v2.OK and len(route.message_queues) == 4
