"""Start real server processes (broker, proxy) for tests: `popgate.cli.cluster.Child`, output kept in memory."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from popgate._metadata import CallMetadata, Credentials
from popgate.cli.cluster import Child, Cluster, ClusterConfig, ClusterError

READY_TIMEOUT_S = 30.0


class ServerProcess:
    """``python -m <module> <args>``, started and awaited until it prints ``ready HOST:PORT`` on stderr."""

    def __init__(self, module: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.module = module
        self.args = args
        self.env = {**os.environ, **(env or {})}
        # Own session off: a Ctrl-C on pytest reaches the servers too. Its last 200 lines, no log file.
        self.child = Child(module, [sys.executable, "-m", module, *args], None, keep_lines=200, own_session=False)

    def start(self) -> ServerProcess:
        self.child.start(self.env)
        try:
            self.child.wait_ready(READY_TIMEOUT_S)
        except ClusterError:
            self.kill()
            raise
        return self

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.child.process

    @property
    def address(self) -> str:
        return self.child.address

    @property
    def lines(self) -> list[str]:
        return self.child.lines

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.child.running

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait (then kill -9); returns the exit code."""
        return self.child.stop(timeout)

    def kill(self) -> None:
        """kill -9."""
        self.child.kill()


# A broker's safety sweep (--sweep-interval-s, 1 s by default) answers held requests whether or not an
# arrival woke them, within the bounds of the tests of wake-on-arrival. Those tests start their brokers
# with these arguments: no sweep runs while they wait, so only the wake on arrival can answer in time.
NO_SWEEP_ARGS = ("--sweep-interval-s", "3600")


def broker_args(name: str, data_dir: Path, *extra: str, listen: str = "127.0.0.1:0") -> list[str]:
    """A test broker's arguments: topics auto-created as under `popgate up` (its dev mode) unless `extra` says
    --no-auto-create, which comes later and wins."""
    return ["--name", name, "--listen", listen, "--data-dir", str(data_dir), "--auto-create", *extra]


def wait_until(predicate: object, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll a condition with a deadline (for state observed from outside a process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]


BROKER_TOKEN = "broker-secret"

# A proxy's configuration with two accounts: `ops` may use the admin service, `app` may publish and consume
# everything but not administer (for `secured_cluster`).
ACCOUNTS = f"""broker_token = "{BROKER_TOKEN}"
[[acl]]
access_key = "ops"
secret_key = "ops-secret-0123456"
admin = true
[[acl]]
access_key = "app"
secret_key = "app-secret-0123456"
publish = ["*"]
subscribe = ["*"]
groups = ["*"]
"""


def signed(access_key: str, secret_key: str) -> tuple[tuple[str, str], ...]:
    """The v2 metadata of a call signed with this account's key."""
    return CallMetadata(client_id="admin-test", credentials=Credentials(access_key, secret_key))()


@contextlib.contextmanager
def secured_cluster(data: Path, proxy_toml: str) -> Iterator[Cluster]:
    """2 brokers that require ``BROKER_TOKEN`` and a proxy configured by ``proxy_toml`` (its
    ``broker_token`` must match); stopped at the end even when a test fails."""
    (data / "proxy.toml").write_text(proxy_toml)
    config = ClusterConfig(
        brokers=2,
        listen="127.0.0.1:0",
        data_dir=data,
        broker_args=("--broker-token", BROKER_TOKEN),
        proxy_args=("--config", str(data / "proxy.toml")),
    )
    with Cluster(config) as started:
        yield started
