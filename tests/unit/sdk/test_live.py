"""The live view of `popgate up` / `popgate top`: topics no group reads, children's states, brokers not asked."""

from __future__ import annotations

import io
import threading
from typing import Any

import pytest
from popgate_pb import broker_pb2 as bpb
from rich.console import Console

from popgate.cli import live
from popgate.cli.admin import Broker
from popgate.cli.live import Frame, render, rows, summarize
from popgate.cli.main import main
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


def test_a_broker_that_left_groups_out_is_said_so() -> None:
    cut = reply()
    cut.cut = True
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(render(Frame("127.0.0.1:8081"), summarize({"b1": cut, "b2": reply()}, at=5.0), None))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "PART          b1 (groups left out" in text and "b2" not in text.split("PART")[1].split("\n")[0]


def test_top_asks_each_broker_with_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """`top --broker` polls with --timeout (a Stats slower than a fixed second showed a healthy broker DOWN)."""
    made: dict[str, Any] = {}

    class View:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.update(kwargs)

        def run(self, stop: threading.Event, interval_s: float) -> None:
            pass

    monkeypatch.setattr(live, "LiveView", View)
    monkeypatch.setattr(live, "fetch_stats", lambda *args, **kwargs: {})
    monkeypatch.setattr(live.signal, "signal", lambda *args: None)
    assert main(["top", "--broker", "b1=127.0.0.1:1", "--timeout", "7"]) == 0
    assert made["timeout_s"] == 7.0


def test_a_refresh_waits_one_timeout_for_brokers_that_do_not_answer() -> None:
    """`top --broker` asks every broker before it waits for any answer: brokers that do not answer (stopped,
    partitioned) cost one --timeout a refresh together, not one each."""
    events: list[str] = []

    class Silent:
        def __init__(self, name: str) -> None:
            self.name = name

        def result(self) -> bpb.StatsResponse:
            events.append(f"waited {self.name}")
            raise live.grpc.RpcError()

    class Stub:
        def __init__(self, name: str) -> None:
            self.Stats = self
            self.name = name

        def future(self, request: bpb.StatsRequest, **_: Any) -> Silent:
            events.append(f"asked {self.name}")
            return Silent(self.name)

    view = live.LiveView("", [Broker("b1", "127.0.0.1:1"), Broker("b2", "127.0.0.1:2")], timeout_s=3.0)
    view._stubs = {name: Stub(name) for name in ("b1", "b2")}  # type: ignore[dict-item]
    sample = view.poll()
    assert events[:2] == ["asked b1", "asked b2"] and len(events) == 4
    assert sample is not None
