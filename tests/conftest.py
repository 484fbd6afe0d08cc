from __future__ import annotations

# The test process's own clients run on the gRPC I/O engine popgate's processes and command run on
# (popgate_process/grpc_engine.py): importing the broker package chooses it before grpc is imported.
import broker as _grpc_engine_chosen  # noqa: F401

# isort: split
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import hypothesis
import pytest
from popgate_pb import broker_pb2_grpc as pb_grpc

from tests.procs import NO_SWEEP_ARGS, ServerProcess, broker_args

# Property tests check behaviour, not speed: no per-example deadline (hypothesis's 200 ms default fails examples on
# a loaded 2-core CI machine, as test_ack_latency.py's once did).
hypothesis.settings.register_profile("popgate", deadline=None)
hypothesis.settings.load_profile("popgate")

# A Spark test's steps take 60-130 s on a loaded 2-core host, past the suite's 120 s; cut short by pytest-timeout's
# signal inside a py4j call, the worker's shared session answers every later Spark test with another call's answer.
SPARK_TIMEOUT_S = 600


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests using the Spark session get SPARK_TIMEOUT_S, unless they set their own."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT_S))


class BrokerHandle:
    """A running broker process plus a blocking stub to it."""

    def __init__(self, name: str, data_dir: Path, extra: list[str]) -> None:
        self.name = name
        self.data_dir = data_dir
        self.extra = extra
        self.proc = ServerProcess("broker", broker_args(name, data_dir, *extra)).start()
        self._open()

    def _open(self) -> None:
        limit = 32 * 1024 * 1024
        self.channel = grpc.insecure_channel(
            self.proc.address,
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)],
        )
        self.stub = pb_grpc.BrokerStub(self.channel)

    @property
    def address(self) -> str:
        return self.proc.address

    def restart(self, *, kill: bool = False, while_stopped: Callable[[], object] | None = None) -> None:
        """Stop (SIGTERM, or kill -9) and start again on the same port and data (`while_stopped` runs between)."""
        port = self.proc.port
        self.channel.close()
        if kill:
            self.proc.kill()
        else:
            self.proc.stop()
        if while_stopped is not None:
            while_stopped()
        args = broker_args(self.name, self.data_dir, *self.extra, listen=f"127.0.0.1:{port}")
        self.proc = ServerProcess("broker", args).start()
        self._open()

    def close(self) -> None:
        self.channel.close()
        self.proc.stop()


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[object]:
    started: list[BrokerHandle] = []

    def make(name: str = "b1", *extra: str) -> BrokerHandle:
        handle = BrokerHandle(name, tmp_path / name, list(extra))
        started.append(handle)
        return handle

    yield make
    with contextlib.ExitStack() as stack:  # every one closed, even when one of them fails to stop
        for handle in started:
            stack.callback(handle.close)


@pytest.fixture
def broker(make_broker: object) -> BrokerHandle:
    return make_broker()  # type: ignore[operator, no-any-return]


@pytest.fixture
def broker_without_sweep(make_broker: object) -> BrokerHandle:
    """A broker whose safety sweep does not run during a test: a held request is answered in time only if
    the arrival of a message wakes it."""
    return make_broker("b1", *NO_SWEEP_ARGS)  # type: ignore[operator, no-any-return]
