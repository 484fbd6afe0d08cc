"""Receives of concurrent callers joined into one on the SDK's Session stream (sdk/_joining.py, sdk/_session.py),
without a stream: when they join, what the joined request asks, and how its messages are shared out."""

from __future__ import annotations

from typing import Any

from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate import _joining, _wire
from popgate.message import Message
from popgate_contract.session_headers import receive_batch_of
from tests.unit.sdk.fakes import Callers

OK = v2.Status(code=v2.OK, message="OK")
RECEIVE_BATCH = 128  # what the proxy said it takes


def receive(batch: int = 32, group: str = "g") -> pb.ReceiveMessageRequest:
    request = pb.ReceiveMessageRequest(batch_size=batch)
    request.group.name = group
    request.message_queue.topic.name = "t"
    request.long_polling_timeout.seconds = 20
    return request


class Receivers(Callers):
    """Receives queued as the Session queues them (`Callers`), and the ids of the messages given back."""

    def __init__(self, receive_batch: int = RECEIVE_BATCH) -> None:
        self.given_back: list[str] = []
        super().__init__(receive_batch, lambda ms: self.given_back.extend(m.system_properties.message_id for m in ms))

    def receive(self, body: pb.ReceiveMessageRequest) -> int:
        return self.request("receive", body)

    def answer(self, request_id: int, *frames: ext.ReceiveMessagesResponse) -> None:
        for frame in frames:
            self.waiting.answer(ext.SessionResponse(id=request_id, receive=frame))

    def received(self, request_id: int) -> list[Message] | _joining._CutShort:
        frames = self.futures[request_id].result()
        return frames if frames is _joining.CUT_SHORT else _wire.received(frames)


def messages(*ids: str) -> ext.ReceiveMessagesResponse:
    """A messages frame; an id "g:..." is a FIFO message of message group g."""
    batch = [
        v2.Message(
            system_properties=v2.SystemProperties(message_id=i, message_group=i.split(":")[0] if ":" in i else None)
        )
        for i in ids
    ]
    return ext.ReceiveMessagesResponse(messages=ext.Messages(messages=batch))


def status(code: int = v2.OK) -> ext.ReceiveMessagesResponse:
    return ext.ReceiveMessagesResponse(status=v2.Status(code=code, message="x"))


def ids(got: Any) -> list[str]:
    return [m.message_id for m in got]


async def test_receives_alike_queued_together_go_as_one_asking_their_batches_added_up() -> None:
    receivers = Receivers()
    a, b = receivers.receive(receive()), receivers.receive(receive())
    (joined,) = receivers.written()
    assert joined.id not in (a, b) and joined.WhichOneof("body") == "receive"
    expected = receive(batch=64)
    assert joined.receive == expected  # the same request, but for its batch
    assert joined.max_fifo == 32  # one receive's worth of FIFO messages, for one caller to take whole


async def test_receives_that_differ_or_a_proxy_that_said_nothing_go_alone() -> None:
    receivers = Receivers()
    receivers.receive(receive()), receivers.receive(receive(batch=16)), receivers.receive(receive(group="h"))
    assert [r.receive.batch_size for r in receivers.written()] == [32, 16, 32]
    silent = Receivers(receive_batch=0)  # a proxy without the header: no receive is a part
    silent.receive(receive()), silent.receive(receive())
    assert [r.receive.batch_size for r in silent.written()] == [32, 32]


async def test_a_joined_receive_asks_at_most_its_limit_and_the_rest_join_another() -> None:
    receivers = Receivers()
    for _ in range(3):
        receivers.receive(receive())
    assert [r.receive.batch_size for r in receivers.written()] == [_joining.MAX_JOINED_RECEIVE, 32]
    small = Receivers(receive_batch=32)  # a proxy taking receives of 32: two of 32 never join
    small.receive(receive()), small.receive(receive())
    assert [r.receive.batch_size for r in small.written()] == [32, 32]


async def test_a_joined_answer_is_shared_out_evenly_in_order_once_its_status_came() -> None:
    receivers = Receivers()
    a, b = receivers.receive(receive()), receivers.receive(receive())
    (joined,) = receivers.written()
    receivers.answer(joined.id, messages("m1", "m2", "m3"))
    assert not receivers.futures[a].done()  # its status is still to come
    receivers.answer(joined.id, messages("m4", "m5"), status())
    assert ids(receivers.received(a)) == ["m1", "m2", "m3"] and ids(receivers.received(b)) == ["m4", "m5"]
    assert receivers.given_back == []


async def test_a_message_groups_run_goes_to_one_caller_whole_and_in_order() -> None:
    """Two callers must never hold messages of one message group at once (FIFO order): every FIFO message of a joined
    answer goes to the first caller, the others are shared."""
    receivers = Receivers()
    a, b = receivers.receive(receive()), receivers.receive(receive())
    (joined,) = receivers.written()
    receivers.answer(joined.id, messages("g:1", "n1", "g:2", "h:1", "n2", "g:3", "n3", "n4"), status())
    assert ids(receivers.received(a)) == ["g:1", "g:2", "h:1", "g:3"]
    assert ids(receivers.received(b)) == ["n1", "n2", "n3", "n4"]
    c, d = receivers.receive(receive(batch=2)), receivers.receive(receive(batch=2))
    (joined,) = receivers.written()
    # More FIFO messages than one receive's worth (a broker that does not bound them): the rest goes back.
    receivers.answer(joined.id, messages("g:1", "g:2", "g:3", "n1"), status())
    assert ids(receivers.received(c)) == ["g:1", "g:2"] and ids(receivers.received(d)) == ["n1"]
    assert receivers.given_back == ["g:3"]


async def test_a_part_that_got_none_is_cut_short_and_an_empty_poll_is_every_parts_answer() -> None:
    receivers = Receivers()
    a, b = receivers.receive(receive()), receivers.receive(receive())
    (joined,) = receivers.written()
    receivers.answer(joined.id, messages("m1"), status())
    assert ids(receivers.received(a)) == ["m1"] and receivers.received(b) is _joining.CUT_SHORT
    c, d = receivers.receive(receive()), receivers.receive(receive())
    (joined,) = receivers.written()
    receivers.answer(joined.id, status(v2.MESSAGE_NOT_FOUND))
    assert receivers.received(c) == [] and receivers.received(d) == []


async def test_a_part_no_longer_waiting_leaves_its_share_to_the_others_and_the_rest_goes_back() -> None:
    receivers = Receivers()
    a, b = receivers.receive(receive()), receivers.receive(receive())
    (joined,) = receivers.written()
    assert receivers.waiting.drop(a)  # its caller timed out or was cancelled
    assert receivers.waiting.to_cancel(a) is None  # b still waits: the joined receive is not cancelled
    receivers.answer(joined.id, messages(*(f"m{i}" for i in range(40))), status())
    assert ids(receivers.received(b)) == [f"m{i}" for i in range(32)]
    assert receivers.given_back == [f"m{i}" for i in range(32, 40)]


async def test_a_caller_cancelled_as_the_answer_comes_leaves_its_share_to_those_waiting() -> None:
    receivers = Receivers()
    a, b = receivers.receive(receive()), receivers.receive(receive())
    (joined,) = receivers.written()
    receivers.futures[a].cancel()  # its task is being cancelled: it has not dropped its request yet
    receivers.answer(joined.id, messages(*(f"m{i}" for i in range(10))), status())
    assert ids(receivers.received(b)) == [f"m{i}" for i in range(10)] and receivers.given_back == []


async def test_a_joined_receive_nobody_waits_for_gives_back_what_came_and_what_comes() -> None:
    receivers = Receivers()
    a, b = receivers.receive(receive()), receivers.receive(receive())
    (joined,) = receivers.written()
    receivers.answer(joined.id, messages("m1"))
    receivers.waiting.drop(a)
    assert receivers.waiting.to_cancel(a) is None
    receivers.waiting.drop(b)
    assert receivers.waiting.to_cancel(b) == joined.id  # the last part gone: the proxy is told to drop it
    assert receivers.given_back == ["m1"]
    receivers.answer(joined.id, messages("m2"), status())
    assert receivers.given_back == ["m1", "m2"]


async def test_a_lost_stream_gives_back_a_joined_receives_messages_so_far() -> None:
    receivers = Receivers()
    a, b = receivers.receive(receive()), receivers.receive(receive())
    (joined,) = receivers.written()
    receivers.answer(joined.id, messages("m1", "m2"))
    receivers.waiting.fail_all(RuntimeError("lost"))
    assert receivers.given_back == ["m1", "m2"]
    assert all(isinstance(receivers.futures[r].exception(), RuntimeError) for r in (a, b))


def test_the_proxys_header_says_how_many_messages_a_receive_may_ask() -> None:
    assert receive_batch_of((("popgate-receive-batch", "128"), ("other", "x"))) == 128
    assert receive_batch_of((("popgate-receive-batch", b"64"),)) == 64
    assert receive_batch_of((("popgate-receive-batch", "lots"),)) == 0
    assert receive_batch_of(()) == 0 and receive_batch_of(None) == 0
