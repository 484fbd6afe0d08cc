"""`popgate up` pieces without processes: argument parsing and the live view's arithmetic."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from popgate_pb import broker_pb2 as bpb
from rich.console import Console

from popgate.cli.cluster import ended
from popgate.cli.live import Sample, render, summarize
from popgate.cli.main import build_parser


def test_up_defaults_match_make_run() -> None:
    args = build_parser().parse_args(["up"])
    assert (args.brokers, args.listen, args.data_dir, args.no_view) == (3, "127.0.0.1:8081", Path("./data"), False)
    assert build_parser().parse_args(["up", "--brokers", "2", "--no-view"]).no_view


@pytest.mark.parametrize("value", ["0", "-1", "0.01", "nan"])
def test_an_interval_that_would_busy_loop_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["up", "--interval", value])
    assert exited.value.code == 2
    assert "argument --interval: " in capsys.readouterr().err
    assert build_parser().parse_args(["up", "--interval", "0.1"]).interval == 0.1


def test_a_child_killed_by_a_signal_is_said_so() -> None:
    assert ended(-9) == "was killed by signal 9 (SIGKILL)"
    assert ended(-100) == "was killed by signal 100"  # no name for it
    assert ended(3) == "exited with code 3"


def stats(broker: str, max_offset: int, acked: int, held: int) -> bpb.StatsResponse:
    return bpb.StatsResponse(
        broker=broker,
        queues=[
            bpb.QueueStats(topic="t", queue_id=0, max_offset=max_offset),
            bpb.QueueStats(topic="%DLQ%g", max_offset=9),
        ],
        groups=[bpb.GroupQueueStats(topic="t", group="g", consumer_offset=acked, lag=max_offset - acked, inflight=1)],
        held_pops=held,
    )


def test_live_view_rates_lag_held_polls_and_down_brokers() -> None:
    before = summarize({"b1": stats("b1", 100, 50, 0), "b2": stats("b2", 0, 0, 0)}, at=10.0)
    now = summarize({"b1": stats("b1", 300, 150, 2), "b2": None}, at=12.0)
    assert (now.produced, now.acked) == ({"b1": 300}, {"b1": 150})
    assert (now.groups[("t", "g")].lag, now.held, now.down) == (150, {"b1": 2}, ["b2"])
    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(render("127.0.0.1:8081", now, before))
    screen = console.file.getvalue()  # type: ignore[attr-defined]
    assert "messages in/s      100.0" in screen and "acked out/s       50.0" in screen
    assert "DOWN          b2" in screen and "b1=2" in screen


def shown_rates(now: Sample, before: Sample | None) -> tuple[float, float]:
    """The 'messages in/s' and 'acked out/s' figures the live view shows."""
    console = Console(file=io.StringIO(), width=100, color_system=None)
    console.print(render("127.0.0.1:8081", now, before))
    found = re.search(r"messages in/s +(-?[0-9.]+) +acked out/s +(-?[0-9.]+)", console.file.getvalue())  # type: ignore[attr-defined]
    assert found is not None
    return float(found[1]), float(found[2])


def test_a_broker_missing_one_poll_neither_lowers_nor_inflates_the_rates() -> None:
    """Both brokers take 10 messages/s in and ack 5/s; b2 misses the poll at t=11."""
    polls = [
        summarize({"b1": stats("b1", 1000, 500, 0), "b2": stats("b2", 2000, 1000, 0)}, at=10.0),
        summarize({"b1": stats("b1", 1010, 505, 0), "b2": None}, at=11.0),
        summarize({"b1": stats("b1", 1020, 510, 0), "b2": stats("b2", 2020, 1010, 0)}, at=12.0),
        summarize({"b1": stats("b1", 1030, 515, 0), "b2": stats("b2", 2030, 1015, 0)}, at=13.0),
    ]
    seen = [shown_rates(now, before) for before, now in zip([None, *polls], polls, strict=False)]
    # b1 alone while b2 is missing from one of the two samples; never -1990 then +2020 msg/s
    assert seen == [(0.0, 0.0), (10.0, 5.0), (10.0, 5.0), (20.0, 10.0)]


def test_live_view_prints_long_names_whole() -> None:
    topic, group = "orders-" + "x" * 40, "billing-" + "y" * 40
    reply = bpb.StatsResponse(
        broker="b1",
        queues=[bpb.QueueStats(topic=topic, queue_id=0, max_offset=5)],
        groups=[bpb.GroupQueueStats(topic=topic, group=group, consumer_offset=0, lag=5)],
    )
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(render("127.0.0.1:8081", summarize({"b1": reply}, at=1.0), None))
    screen = console.file.getvalue()  # type: ignore[attr-defined]
    # folded onto two lines, nothing cut: every character of both names is on the screen
    table = screen[screen.index("topic") :]
    assert "orders-" in table and "billing-" in table and table.count("x") == 40 and table.count("y") == 40
