"""Generated requests to every MessagingService RPC: the proxy never crashes and always answers a v2 status."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import given
from hypothesis import strategies as st
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.ext import messaging_pb2_grpc as ext_grpc
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb
from popgate_pb.v2 import service_pb2_grpc as pb_grpc

from popgate.cli.cluster import Cluster, ClusterConfig
from tests.fuzzing import CASES, FUZZ, report, requests

CODES = set(v2.Code.values())


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    """A channel to a proxy of one broker (stopped cleanly, with no traceback in its log, at the end)."""
    # Short long polls so generated receives answer quickly.
    args = ("--max-long-polling-s", "0.3", "--default-long-polling-s", "0.2", "--poll-reserve-s", "0.05")
    cluster = Cluster(
        ClusterConfig(brokers=1, listen="127.0.0.1:0", data_dir=tmp_path_factory.mktemp("fz"), proxy_args=args)
    )
    cluster.start()
    channel = grpc.insecure_channel(cluster.endpoint, options=[("grpc.max_send_message_length", -1)])
    try:
        yield channel
    finally:
        channel.close()
        cluster.stop()
        report("proxy")
    proxy_child = cluster.proxies[0]
    assert proxy_child.process is not None and proxy_child.process.returncode == 0, "proxy did not stop cleanly"
    log = proxy_child.log_path.read_text()
    assert "Traceback" not in log and "unexpected error" not in log, log[-3000:]


@pytest.fixture(scope="module")
def proxy(channel: grpc.Channel) -> pb_grpc.MessagingServiceStub:
    return pb_grpc.MessagingServiceStub(channel)  # type: ignore[no-untyped-call]


UNARY = ["QueryRoute", "Heartbeat", "SendMessage", "QueryAssignment", "AckMessage", "ForwardMessageToDeadLetterQueue",
         "UpdateOffset", "GetOffset", "QueryOffset", "EndTransaction", "NotifyClientTermination",
         "ChangeInvisibleDuration", "RecallMessage", "SyncLiteSubscription"]  # fmt: skip


@pytest.mark.parametrize("method", UNARY)
def test_unary_rpcs_answer_a_v2_status_for_any_request(proxy: pb_grpc.MessagingServiceStub, method: str) -> None:
    request_cls = getattr(pb, f"{method}Request")

    @FUZZ
    @given(requests(request_cls))
    def check(request: Message) -> None:
        CASES[f"proxy.{method}"] += 1
        response = getattr(proxy, method)(request, timeout=10)
        assert response.status.code in CODES and response.status.code != v2.CODE_UNSPECIFIED, response.status

    check()


def test_shared_sends_answer_a_v2_status_for_any_request(channel: grpc.Channel) -> None:
    """popgate.ext.v1's SendShared (what the SDK's send_many is), on the same port: answered as a SendMessage."""
    shared = ext_grpc.MessagingStub(channel)  # type: ignore[no-untyped-call]

    @FUZZ
    @given(requests(ext.SendShared))
    def check(request: Message) -> None:
        CASES["proxy.SendShared"] += 1
        response = shared.SendShared(request, timeout=10)
        assert response.status.code in CODES and response.status.code != v2.CODE_UNSPECIFIED, response.status

    check()


def test_receive_message_streams_end_with_a_v2_status(proxy: pb_grpc.MessagingServiceStub) -> None:
    @FUZZ
    @given(requests(pb.ReceiveMessageRequest))
    def check(request: Message) -> None:
        CASES["proxy.ReceiveMessage"] += 1
        frames = list(proxy.ReceiveMessage(request, timeout=10))
        assert frames and frames[-1].HasField("status"), frames
        assert frames[-1].status.code in CODES and frames[-1].status.code != v2.CODE_UNSPECIFIED, frames[-1].status

    check()


def test_pull_message_answers_not_implemented(proxy: pb_grpc.MessagingServiceStub) -> None:
    frames = list(proxy.PullMessage(pb.PullMessageRequest(), timeout=5))
    assert [f.status.code for f in frames] == [v2.NOT_IMPLEMENTED]


def test_telemetry_answers_settings_and_survives_any_command(proxy: pb_grpc.MessagingServiceStub) -> None:
    @FUZZ
    @given(st.lists(requests(pb.TelemetryCommand), min_size=1, max_size=3))
    def check(commands: list[Message]) -> None:
        CASES["proxy.Telemetry"] += 1
        replies = list(proxy.Telemetry(iter(commands), timeout=10))
        asked = [c.settings for c in commands if c.HasField("settings")]
        assert len(replies) == len(asked)
        for sent, reply in zip(asked, replies, strict=True):
            assert reply.status.code == v2.OK and reply.HasField("settings"), reply
            # What the official clients take from the reply (proxy/v2/telemetry.py): a consumer's long-polling
            # time (0 would busy-loop) and retry policy, a producer's body limit (0 would refuse every send).
            if sent.HasField("subscription"):
                assert reply.settings.subscription.long_polling_timeout.ToTimedelta().total_seconds() > 0, reply
                assert reply.settings.backoff_policy.max_attempts > 0, reply
            else:
                assert reply.settings.publishing.max_body_size > 0, reply
                assert reply.settings.backoff_policy.max_attempts > 0, reply

    check()


def test_the_proxy_still_serves_after_the_fuzzing(proxy: pb_grpc.MessagingServiceStub) -> None:
    route = proxy.QueryRoute(pb.QueryRouteRequest(topic=v2.Resource(name="after")), timeout=5)
    assert route.status.code == v2.OK and len(route.message_queues) == 4
