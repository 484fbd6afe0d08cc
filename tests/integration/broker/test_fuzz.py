"""Generated requests to every popgate.broker.v1.Broker RPC, the Session stream included: the broker never
crashes, every reject is a mapped gRPC status with the ``popgate-error`` trailer naming the domain error, and
it still serves afterwards (health, Stats, a send and pop) with no traceback in its log."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given
from hypothesis import strategies as st
from popgate_pb import broker_pb2 as pb
from popgate_pb import broker_pb2_grpc as pb_grpc

from popgate_contract.session_client import MAX_WRITE_BYTES
from tests.fuzzing import CASES, FUZZ, report, requests
from tests.procs import ServerProcess, broker_args

# The domain-error table of broker/handlers.py (INTERNAL: a DomainError without a more specific class).
MAPPED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
}
MAPPED_NUMBERS = {code.value[0] for code in MAPPED}
UNARY = ["Send", "Pop", "Ack", "ChangeInvisibleTime", "Renew", "Notification", "DeadLetter", "Stats", "ListMessages",
         "Recall", "EndTransaction", "TransactionChecks"]  # fmt: skip


class Target:
    def __init__(self, proc: ServerProcess) -> None:
        self.proc = proc
        limit = 32 * 1024 * 1024
        options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
        self.channel = grpc.insecure_channel(proc.address, options=options)
        self.stub = pb_grpc.BrokerStub(self.channel)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    # Short holds so generated long polls answer quickly; 1 queue so handles like 1~b1~fuzz~0~... can match.
    extra = ("--max-poll-s", "300ms", "--queues-per-topic", "1")
    proc = ServerProcess("broker", broker_args("b1", tmp_path_factory.mktemp("bfz") / "b1", *extra)).start()
    target = Target(proc)
    try:
        seed = [pb.Message(topic="fuzz", body=b"seed", message_id=f"seed{i}") for i in range(20)]
        target.stub.Send(pb.SendRequest(messages=seed), timeout=10)
        yield target
    finally:
        target.channel.close()
        code = proc.stop()
        report("broker")
    assert code == 0, "broker did not stop cleanly"
    log = "\n".join(proc.lines)
    assert "Traceback" not in log and "failed" not in log, log[-3000:]


def check_reject(exc: grpc.RpcError) -> None:
    code = exc.code()  # type: ignore[attr-defined]
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (exc.details() or ""):  # type: ignore[attr-defined]
        return  # over --max-grpc-message-bytes: refused by grpc itself, before any handler could name an error
    name = dict(exc.trailing_metadata() or ()).get("popgate-error", "")  # type: ignore[attr-defined]
    assert code in MAPPED and name and name != "DomainError", (code, name, exc.details())  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", UNARY)
def test_unary_rpcs_answer_or_reject_with_a_named_error(broker: Target, method: str) -> None:
    @FUZZ
    @given(requests(getattr(pb, f"{method}Request")))
    def check(request: Message) -> None:
        CASES[f"broker.{method}"] += 1
        try:
            getattr(broker.stub, method)(request, timeout=10)
        except grpc.RpcError as exc:
            check_reject(exc)

    check()
    still_serves(broker)


def session_requests() -> st.SearchStrategy[pb.SessionRequest]:
    """A stream message: one request alone, or with `more` (one level; now and then an entry nesting its own,
    which the broker refuses)."""
    single = session_request()
    return st.one_of(single, st.builds(joined, single, st.lists(single, max_size=3), st.booleans()))


def joined(first: pb.SessionRequest, more: list[pb.SessionRequest], nest: bool) -> pb.SessionRequest:
    """As a client joins them: within its bound, but for a first request larger alone."""
    more = [m for m in more if m.ByteSize() <= MAX_WRITE_BYTES]
    while more and first.ByteSize() + sum(m.ByteSize() for m in more) > MAX_WRITE_BYTES:
        more.pop()
    first.more.extend(more)
    if nest and more:
        first.more[-1].more.append(more[0])
    return first


def without_more(request: Message) -> pb.SessionRequest:
    assert isinstance(request, pb.SessionRequest)
    request.ClearField("more")  # generated to depth 4, 3 each, 4 MiB bodies: past any stream message bound
    return request


def session_request() -> st.SearchStrategy[pb.SessionRequest]:
    ids = st.integers(0, 4)  # few ids: duplicates of pending ids and cancels that hit something
    return st.one_of(
        st.builds(lambda i, r: pb.SessionRequest(id=i, pop=r), ids, requests(pb.PopRequest)),
        st.builds(lambda i, r: pb.SessionRequest(id=i, notification=r), ids, requests(pb.NotificationRequest)),
        st.builds(lambda i, r: pb.SessionRequest(id=i, send=r), ids, requests(pb.SendRequest)),
        st.builds(lambda i, r: pb.SessionRequest(id=i, ack=r), ids, requests(pb.AckRequest)),
        st.builds(
            lambda i, r: pb.SessionRequest(id=i, change_invisible=r), ids, requests(pb.ChangeInvisibleTimeRequest)
        ),
        st.builds(lambda i, r: pb.SessionRequest(id=i, renew=r), ids, requests(pb.RenewRequest)),
        st.builds(lambda i, r: pb.SessionRequest(id=i, group_config=r), ids, requests(pb.GroupConfigRequest)),
        st.builds(lambda i, r: pb.SessionRequest(id=i, end_transaction=r), ids, requests(pb.EndTransactionRequest)),
        st.builds(
            lambda i, r: pb.SessionRequest(id=i, change_invisible_many=r), ids, requests(pb.ChangeInvisibleTimesRequest)
        ),
        st.builds(lambda i: pb.SessionRequest(id=i, cancel=True), ids),
        st.builds(lambda i: pb.SessionRequest(id=i), ids),
        requests(pb.SessionRequest).map(without_more),
    )


def test_session_stream_answers_every_request_or_a_named_error(broker: Target) -> None:
    @FUZZ
    @given(st.lists(session_requests(), min_size=1, max_size=6))
    def check(batch: list[pb.SessionRequest]) -> None:
        CASES["broker.Session"] += 1
        # A stream message's `more` entries are served as if each came alone (one level: an entry with `more` of
        # its own is answered with an error, its nested entries are not served).
        entries = [entry for r in batch for entry in r.more]
        most = sum(r.WhichOneof("body") != "cancel" for r in batch)  # a cancel of a pending id removes one answer
        most += sum(bool(e.more) or e.WhichOneof("body") != "cancel" for e in entries)
        sure = sure_answer(batch)
        answers, rejected = read_answers(broker, batch, most, sure)
        assert len(answers) <= most
        assert rejected or sure is None or sure.id in {a.id for a in answers}, (sure, answers)
        for answer in answers:
            assert answer.id in {r.id for r in [*batch, *entries]}
            kind = answer.WhichOneof("body")
            assert kind in (
                "pop",
                "notification",
                "send",
                "ack",
                "change_invisible",
                "renew",
                "group_config",
                "end_transaction",
                "change_invisible_many",
                "error",
            ), answer
            if kind == "error":
                assert answer.error.error not in ("", "DomainError"), answer
                assert answer.error.grpc_code in MAPPED_NUMBERS, answer

    check()
    still_serves(broker)


def sure_answer(batch: list[pb.SessionRequest]) -> pb.SessionRequest | None:
    """The first stream message's request the broker must answer: not a cancel, and its id used by no other
    request of the batch (another could cancel it, or end the stream by reusing it while pending)."""
    ids = Counter(request.id for r in batch for e in (r, *r.more) for request in (e, *e.more))
    return next((r for r in batch if r.WhichOneof("body") != "cancel" and ids[r.id] == 1), None)


def read_answers(
    broker: Target, batch: list[pb.SessionRequest], most: int, sure: pb.SessionRequest | None
) -> tuple[list[pb.SessionResponse], bool]:
    """Every answer the stream gives, and whether it ended with a named error. Our side stays open (the proxy
    ends its streams by cancel); it is cancelled once `most` answers came, or 0.6 s after the start (holds last
    at most 300 ms, --max-poll-s) once `sure` was answered, at most 5 s later."""
    done, sure_or_done = threading.Event(), threading.Event()

    def outgoing() -> Iterator[pb.SessionRequest]:
        yield from batch
        done.wait(10.0)

    answers: list[pb.SessionResponse] = []
    call = broker.stub.Session(outgoing(), timeout=10)

    def stop_later() -> None:
        if not done.wait(0.6):
            sure_or_done.wait(5.0)
            call.cancel()

    stopper = threading.Thread(target=stop_later)
    stopper.start()
    if sure is None or most == 0:
        sure_or_done.set()
    try:
        if most == 0:
            call.cancel()
        for answer in call:
            answers.append(answer)
            if sure is not None and answer.id == sure.id:
                sure_or_done.set()
            if len(answers) >= most:
                call.cancel()
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
            check_reject(exc)  # only grpc's own size limit ends the stream otherwise
            return answers, True
    finally:
        done.set()
        sure_or_done.set()
        stopper.join()
    return answers, False


def still_serves(broker: Target) -> None:
    """After a fuzz run: healthy, stores and pops, and alive."""
    health = health_pb2_grpc.HealthStub(broker.channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    topic = f"after-{uuid.uuid4().hex[:8]}"
    sent = broker.stub.Send(pb.SendRequest(messages=[pb.Message(topic=topic, body=b"x")]), timeout=5)
    assert len(sent.results) == 1
    popped = broker.stub.Pop(pb.PopRequest(topic=topic, group="g", max_messages=1, invisible_ms=1000), timeout=5)
    assert [m.stored.message.body for m in popped.messages] == [b"x"]
    assert broker.proc.alive()


def test_a_session_half_closed_right_after_a_request_ends(tmp_path: Path) -> None:
    # Found by the fuzzing: a Session half-closed by its client while the broker wrote an answer never ended
    # (the writer was cancelled mid-write). Its own broker, so its log can be checked on its own.
    proc = ServerProcess("broker", broker_args("b1", tmp_path / "b1")).start()
    target = Target(proc)
    hung = 0
    try:
        for _ in range(10):
            try:
                list(target.stub.Session(iter([pb.SessionRequest(id=1)]), timeout=0.5))
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
                hung += 1
    finally:
        target.channel.close()
        proc.stop()
    assert hung == 0, f"{hung} of 10 streams never ended"
    assert not [line for line in proc.lines if "Traceback" in line], "\n".join(proc.lines)
