"""Messages encoded once on their way to a broker (proxy/outgoing.py): they read, at the broker, as the messages
they stand for."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from popgate_pb import broker_pb2 as bpb

from proxy.outgoing import FIELD_OVERHEAD, Run, chunks, runs_of, shared_run

TEMPLATE = bpb.Message(
    topic="orders",
    message_id="first-id",
    body=b"first body",
    tag="paid",
    keys=["k1", "k2"],
    properties={"a": "1", "b": "2"},
    born_ms=1_764_000_000_123,
    born_host="10.0.0.1",
    message_group="g",
    deliver_at_ms=0,
    priority=0,
)


@given(
    st.lists(
        st.tuples(st.binary(min_size=1, max_size=20_000), st.text(min_size=1, max_size=128)), min_size=1, max_size=8
    )
)
def test_a_shared_runs_messages_read_as_the_broker_messages_they_stand_for(messages: list[tuple[bytes, str]]) -> None:
    bodies = [body for body, _ in messages]
    ids = [message_id for _, message_id in messages]
    run = shared_run(TEMPLATE, bodies, ids)
    held = len(run.shared) + sum(map(len, bodies)) + sum(map(len, ids))
    assert (run.topic, run.group, run.ids, run.held_bytes) == ("orders", "g", ids, held)
    [chunk] = chunks([(0, run)], budget=1 << 30)
    request = bpb.SessionRequest.FromString(b"".join([b"\x08\x07", *chunk.request(runs=True)]))  # id: the session's
    shared = bpb.Message()
    shared.CopyFrom(TEMPLATE)
    shared.ClearField("body")
    shared.ClearField("message_id")
    assert request.id == 7 and request.send == bpb.SendRequest(
        runs=[bpb.SharedRun(shared=shared, bodies=bodies, message_ids=ids)]
    )
    assert chunk.places == list(range(len(ids)))
    expected = []  # what a broker that does not read runs is sent: each message whole
    for body, message_id in messages:
        m = bpb.Message()
        m.CopyFrom(TEMPLATE)
        m.body, m.message_id = body, message_id
        expected.append(m)
    whole = bpb.SessionRequest.FromString(b"".join(chunk.request(runs=False)))
    assert list(whole.send.messages) == expected and not whole.send.runs
    counted = sum(run.sizes()) + 6  # + the Send's own tag and length: what a budget bounds, sent either way
    assert max(len(b"".join(chunk.request(runs=kind))) for kind in (True, False)) <= counted


def test_messages_go_as_runs_of_one_topic_and_group_in_their_order() -> None:
    messages = [
        bpb.Message(topic="a", message_id="1", body=b"x"),
        bpb.Message(topic="a", message_id="2", body=b"yy"),
        bpb.Message(topic="a", message_id="3", body=b"z", message_group="g"),
        bpb.Message(topic="b", message_id="4", body=b"w"),
        bpb.Message(topic="a", message_id="5", body=b"v"),
    ]
    runs = runs_of(messages)
    assert [(r.topic, r.group, r.ids, r.held_bytes) for r in runs] == [
        ("a", "", ["1", "2"], sum(m.ByteSize() for m in messages[:2])),
        ("a", "g", ["3"], messages[2].ByteSize()),
        ("b", "", ["4"], messages[3].ByteSize()),
        ("a", "", ["5"], messages[4].ByteSize()),
    ]
    assert [bpb.Message.FromString(data) for r in runs for data in r.encoded or ()] == messages


def test_a_send_is_cut_into_chunks_within_the_budget_each_of_one_kind_in_the_requests_order() -> None:
    shared = shared_run(bpb.Message(topic="b"), [b"y" * 100] * 3, ["1", "2", "3"])
    whole = Run("a", "", ["4", "5", "6"], 300, encoded=[b"x" * 100] * 3)
    size = shared.sizes()[0]
    cut = chunks([(0, shared), (3, whole)], budget=2 * size)
    assert [(c.places, c.topic) for c in cut] == [([0, 1], "b"), ([2], "b"), ([3, 4], "a"), ([5], "a")]
    sent = [bpb.SessionRequest.FromString(b"".join(c.request(runs=True))).send for c in cut]
    assert [len(s.messages) for s in sent] == [0, 0, 2, 1]
    assert [[list(r.message_ids) for r in s.runs] for s in sent] == [[["1", "2"]], [["3"]], [], []]
    alone = chunks([(0, Run("a", "", ["1"], 1000, encoded=[b"z" * 1000]))], budget=10)  # over the budget: alone
    assert [(c.places, c.topic) for c in alone] == [([0], "a")]
    assert whole.sizes() == [100 + FIELD_OVERHEAD] * 3
    mixed = chunks([(0, Run("a", "", ["1"], 1, encoded=[b"z"])), (1, Run("b", "", ["2"], 1, encoded=[b"w"]))], 1 << 20)
    assert [(c.places, c.topic) for c in mixed] == [([0, 1], None)]  # one kind, two topics: one Send
