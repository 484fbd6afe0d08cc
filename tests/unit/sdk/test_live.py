"""The live view of `popgate up` / `popgate top`: topics no group reads, children's states, brokers not asked."""

from __future__ import annotations

import io

from popgate_pb import broker_pb2 as bpb
from rich.console import Console

from popgate.cli.live import Frame, render, rows, summarize
from popgate.cli.supervisor import State, Status


def reply() -> bpb.StatsResponse:
    return bpb.StatsResponse(
        broker="b1",
        queues=[
            bpb.QueueStats(topic="orders", queue_id=0, max_offset=7),
            bpb.QueueStats(topic="fresh", queue_id=0, max_offset=3),
            bpb.QueueStats(topic="%DLQ%billing", queue_id=0, max_offset=1),
        ],
        groups=[bpb.GroupQueueStats(topic="orders", group="billing", lag=2, inflight=1)],
    )


def screen(frame: Frame) -> str:
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(render(frame, summarize({"b1": reply()}, at=5.0), None))
    return console.file.getvalue()  # type: ignore[attr-defined,no-any-return]


def test_a_topic_no_group_reads_yet_is_shown_with_its_messages() -> None:
    assert rows(summarize({"b1": reply()}, at=1.0)) == [
        ("orders", "billing", "2", "1", "7"),
        ("fresh", "-", "-", "-", "3"),  # no group yet; the DLQ topic is not listed on its own
    ]
    assert "fresh" in screen(Frame("127.0.0.1:8081"))


def test_the_children_of_popgate_up_show_their_state_and_restarts() -> None:
    processes = [Status("b1", State.WAITING, restarts=2, due=6.5), Status("proxy")]
    text = screen(Frame("127.0.0.1:8081", processes=processes))
    assert "processes     b1 restarting in 1.5s (2 restarts)  proxy up" in text


def test_top_names_the_brokers_it_was_not_told_of() -> None:
    text = screen(Frame("127.0.0.1:8081", quit_hint="Ctrl-C quits", unknown=["b3"]))
    assert "NOT ASKED     b3" in text and "(Ctrl-C quits)" in text
