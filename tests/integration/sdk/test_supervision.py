"""The supervisor `popgate up` runs, over real children: what the live view shows while they die and return."""

from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

from rich.console import Console

from popgate import Producer
from popgate.cli.admin import Broker
from popgate.cli.live import Frame, LiveView, render
from popgate.cli.supervisor import Backoff, State, Supervisor
from tests.integration.sdk.conftest import eventually, start_cluster


def test_killed_broker_and_proxy_come_back_and_the_live_view_shows_it(tmp_path: Path) -> None:
    cluster = start_cluster(tmp_path / "data", brokers=2)
    restarted: list[str] = []
    back = threading.Event()

    def on_restart(child: object) -> None:
        restarted.append(getattr(child, "name", ""))
        back.set()

    supervisor = Supervisor(cluster, backoff=Backoff(first_s=0.1), on_restart=on_restart)
    supervisor.start()
    try:
        endpoint, b2 = cluster.endpoint, cluster.brokers["b2"].address
        for victim in (cluster.brokers["b2"], cluster.proxies[0]):
            back.clear()
            assert victim.process is not None
            os.kill(victim.process.pid, signal.SIGKILL)
            assert back.wait(20), f"{victim.name} was not restarted"
        assert restarted == ["b2", "proxy"]
        assert (cluster.brokers["b2"].address, cluster.endpoint) == (b2, endpoint)  # the same addresses
        with Producer(endpoint) as producer:  # the cluster serves again through the restarted proxy
            producer.send("supervised", b"back")
        brokers = [Broker(n, c.address) for n, c in cluster.brokers.items()]
        view = LiveView(endpoint, brokers, processes=supervisor.statuses)
        try:
            sample = eventually(lambda: s if not (s := view.poll()).down else None, what="both brokers answering")
        finally:
            view.close()
        statuses = supervisor.statuses()
        assert all(s.state is State.UP for s in statuses) and {s.name: s.restarts for s in statuses} == {
            "b1": 0,
            "b2": 1,
            "proxy": 1,
        }
        console = Console(file=io.StringIO(), width=120, color_system=None)
        console.print(render(Frame(endpoint, processes=statuses), sample, None))
        assert "processes     b1 up  b2 up (1 restart)  proxy up (1 restart)" in console.file.getvalue()  # type: ignore[attr-defined]
    finally:
        supervisor.close()
        cluster.stop()
        supervisor.release()
