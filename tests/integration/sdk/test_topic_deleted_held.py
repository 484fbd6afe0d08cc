"""A receive held at the brokers when its topic is deleted is told TOPIC_NOT_FOUND at once, whatever the proxy's
receive mode: a long poll held by one broker's Pop too, not only a notify run over several (docs/BROKER.md,
DeleteTopic)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from popgate import NotFound, SimpleConsumer
from popgate.cli.cluster import Cluster, ClusterConfig
from popgate.cli.main import main
from tests.integration.sdk.test_operate import held_requests
from tests.procs import wait_until


@pytest.fixture(scope="module", params=["longpoll", "notify"])
def strict(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(
        brokers=2,
        listen="127.0.0.1:0",
        data_dir=tmp_path_factory.mktemp("held"),
        auto_create=False,
        receive_mode=request.param,
    )
    with Cluster(config) as started:
        yield started


def test_a_held_receive_is_told_topic_not_found_when_its_topic_is_deleted(strict: Cluster) -> None:
    e = strict.endpoint
    assert main(["topic", "create", "going", "-e", e]) == 0
    outcome: list[BaseException] = []
    with SimpleConsumer(e, "waiter", "going") as waiter:

        def receive() -> None:
            try:
                outcome.append(RuntimeError(f"answered {waiter.receive(max=1, wait=15)!r}"))
            except NotFound as exc:
                outcome.append(exc)

        receiver = threading.Thread(target=receive)
        receiver.start()
        assert wait_until(lambda: held_requests(strict, "going") > 0)  # held at the brokers
        started = time.monotonic()
        assert main(["topic", "delete", "going", "--yes", "-e", e]) == 0
        receiver.join(20)
    assert outcome and isinstance(outcome[0], NotFound), outcome
    assert time.monotonic() - started < 5  # at once, not after its 15 s poll nor at the client's next receive
