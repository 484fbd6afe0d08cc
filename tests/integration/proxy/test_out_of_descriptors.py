"""A proxy at its descriptor limit (`popgate_process.event_loop`): it keeps serving the clients it has, spends little
CPU and logs a line now and then — not a traceback per accept retry, whose retries multiply — and serves new clients
again once descriptors are free, without a restart."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate import Producer
from popgate.cli.cluster import Child
from tests.procs import ServerProcess, broker_args

NOFILE = 64  # the proxy's descriptor limit: a few dozen connections exhaust it


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100


@pytest.fixture
def limited_proxy(tmp_path: Path) -> Iterator[Child]:
    broker = ServerProcess("broker", broker_args("b1", tmp_path / "b1")).start()
    # prlimit (util-linux) sets the limit of the process it starts: the proxy, not this test.
    argv = ["prlimit", f"--nofile={NOFILE}:{NOFILE}", sys.executable, "-m", "proxy"]
    proxy = Child("proxy", [*argv, "--broker", f"b1={broker.address}", "--listen", "127.0.0.1:0"], None,
                  keep_lines=200, own_session=False)  # fmt: skip
    try:
        proxy.start(None)
        proxy.wait_ready(30)
        yield proxy
    finally:
        proxy.stop(15)
        broker.stop()


def test_a_proxy_out_of_descriptors_stays_quiet_serves_its_clients_and_recovers(limited_proxy: Child) -> None:
    address, pid = limited_proxy.address, limited_proxy.process.pid  # type: ignore[union-attr]
    host, port = address.rsplit(":", 1)
    with Producer(address) as connected:
        connected.send("t", b"before")
        held = []
        try:
            for _ in range(NOFILE * 3):  # past the limit, and past the listen queue behind it
                sock = socket.create_connection((host, int(port)), timeout=1)
                held.append(sock)
        except OSError:
            pass  # the listen queue is full: the kernel no longer answers
        started = cpu_s(pid)
        time.sleep(3)
        used = cpu_s(pid) - started
        connected.send("t", b"while out of descriptors")  # its connection was made before: still served
        lines = [line for line in limited_proxy.lines if "accept" in line]
        for sock in held:
            sock.close()
    assert used < 1.0, f"{used:.2f} s of CPU in 3 s at the descriptor limit"
    assert 1 <= len(lines) <= 2, lines[-3:]
    assert "cannot accept connections" in lines[0]
    with Producer(address, request_timeout=10) as after:
        after.send("t", b"after")  # a new client, once descriptors are free
