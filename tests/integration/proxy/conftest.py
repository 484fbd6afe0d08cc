"""Real broker and proxy processes (popgate.cli.cluster) on free loopback ports; always torn down."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from popgate.cli.cluster import Cluster, ClusterConfig

MakeCluster = Callable[..., Cluster]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    started: list[Cluster] = []

    def make(brokers: int = 2, proxy_args: tuple[str, ...] = ("--min-invisible-s", "1")) -> Cluster:
        cluster = Cluster(
            ClusterConfig(
                brokers=brokers, listen="127.0.0.1:0", data_dir=tmp_path / f"c{len(started)}", proxy_args=proxy_args
            )
        )
        started.append(cluster)
        cluster.start()
        return cluster

    yield make
    with contextlib.ExitStack() as stack:  # every one stopped, even when one of them fails to stop
        for cluster in started:
            stack.callback(cluster.stop)
