"""popgate's ReceiveMessages framing: many messages per frame, bounded by size, each read as v2 would give it."""

from __future__ import annotations

from popgate_pb.v2 import definition_pb2 as v2

from proxy.v2.convert import to_client
from proxy.v2.receive import V2, BatchFraming
from tests.unit.proxy.fakes import popped


def test_batch_frames_hold_messages_up_to_their_size_and_a_larger_one_alone() -> None:
    framing = BatchFraming(max_bytes=100)
    sizes = [40, 40, 40, 250, 10, 100, 1]
    messages = [popped("b1", f"m{i}", body=b"x" * n) for i, n in enumerate(sizes)]
    frames = framing.frames(sizes)
    assert frames == [range(0, 2), range(2, 3), range(3, 4), range(4, 5), range(5, 6), range(6, 7)]
    assert [i for frame in frames for i in frame] == list(range(len(messages)))  # each once, in order
    assert framing.frames([]) == []


def test_a_batch_frame_carries_each_message_as_the_v2_frame_does() -> None:
    messages = [popped("b1", "m0", body=b"a"), popped("b1", "m1", body=b"bb", attempt=3)]
    batch = BatchFraming().frame(messages, range(0, 2), True, "ns")
    assert batch.WhichOneof("content") == "messages" and batch.messages.HasField("delivery_timestamp")
    for i, message in enumerate(batch.messages.messages):
        assert message == V2.frame(messages, range(i, i + 1), False, "ns").message
        assert message == to_client(messages[i], namespace="ns")
    later = BatchFraming().frame(messages, range(1, 2), False, "")
    assert not later.messages.HasField("delivery_timestamp") and len(later.messages.messages) == 1


def test_v2_frames_one_message_each_after_a_timestamp() -> None:
    messages = [popped("b1", f"m{i}") for i in range(3)]
    assert V2.frames([len(m.stored.message.body) for m in messages]) == [range(0, 1), range(1, 2), range(2, 3)]
    assert V2.opening().HasField("delivery_timestamp")
    assert BatchFraming().opening() is None
    status = v2.Status(code=v2.OK)
    assert V2.status(status).status == status and BatchFraming().status(status).status == status
