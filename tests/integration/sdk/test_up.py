"""`popgate up` as a user runs it: stopped by a signal it leaves no broker or proxy behind; bad start-ups fail fast."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from popgate import MessageBodyTooLarge, Producer, SimpleConsumer
from popgate.cli.main import main
from tests.integration.sdk.conftest import drain, eventually
from tests.integration.sdk.popgate_up import POPGATE, Up, children_of

# Children inherit the environment: a short shutdown grace keeps each stop well under a second.
ENV = dict(os.environ, POPGATE_SHUTDOWN_GRACE_S="0.5")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    process = Up(tmp_path / "data", env=ENV)
    try:
        process.wait_ready(30)
        assert len(process.children) == 2, process.children  # b1 and the proxy
        yield process
    finally:
        process.kill_all()  # a no-op after a passing test


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP-terminal-closed"])
def test_a_signal_stops_the_cluster_and_leaves_no_child(up: Up, sig: int) -> None:
    with Producer(up.endpoint) as producer:
        producer.send("up-signal", b"served")
    assert up.stop(sig, timeout_s=20) == 0
    assert "popgate: stopping" in up.lines
    assert up.left_behind(0) == []  # `up` waited for each of them before exiting


def test_children_die_with_a_sigkilled_up(up: Up) -> None:
    assert up.stop(signal.SIGKILL, timeout_s=10) == -signal.SIGKILL
    assert up.left_behind(15) == [], "brokers or proxy outlived `popgate up`"


def test_with_no_restart_a_killed_child_stops_up_with_its_name_and_the_signal(tmp_path: Path) -> None:
    up = Up(tmp_path / "data", env=ENV, extra=["--no-restart"])
    try:
        up.wait_ready(30)
        os.kill(up.children[0].pid, signal.SIGKILL)  # as the OOM killer would
        assert up.wait(20) == 1  # `up` noticed by itself: nobody signalled it
        said = "was killed by signal 9 (SIGKILL); last output:"  # not "exited with code -9"
        died = [line for line in up.lines if line.startswith("popgate up: ") and line.endswith(said)]
        assert len(died) == 1, up.lines
        assert up.left_behind(10) == [], "the other child was left running"
    finally:
        up.kill_all()


def is_broker(pid: int) -> bool:
    return b"broker" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def test_a_killed_broker_is_restarted_on_its_port_with_its_messages(up: Up, capsys: pytest.CaptureFixture[str]) -> None:
    """popgate.cli.supervisor: kill -9 of a broker under `popgate up` brings it back; the cluster serves on."""
    address = up.brokers()["b1"]
    with Producer(up.endpoint) as producer:
        sent = {producer.send("up-restart", f"m{i}".encode()).message_id for i in range(5)}
    victim = next(child for child in up.children if is_broker(child.pid))
    os.kill(victim.pid, signal.SIGKILL)
    assert up.wait_for_line("popgate: b1 restarted at ", 20) == f"popgate: b1 restarted at {address}"  # its port
    assert "popgate: b1 was killed by signal 9 (SIGKILL); restarting it in 0.5 s" in up.lines
    up.children = children_of(up.proc.pid)  # the new broker's pid
    stats = ["stats", "--broker", f"b1={address}", "--endpoint", up.endpoint, "-t", "up-restart", "--timeout", "1"]
    # `stats` shows it return: complete (exit 0) once the proxy too routes to it again (its health checks, 1 s)
    eventually(lambda: main(stats) == 0 or None, timeout=10, what="popgate stats exiting 0")
    assert "(1 of 1 brokers)" in capsys.readouterr().out
    with SimpleConsumer(up.endpoint, "up-restart-group", "up-restart") as consumer:
        got = {m.message_id for m in drain(consumer, len(sent), timeout=20)}
    assert got == sent  # what was sent before the kill is still there (its data directory)
    assert up.stop(signal.SIGINT, timeout_s=20) == 0  # the restarted broker stops in order too
    assert up.left_behind(0) == []


def test_ctrl_c_while_starting_stops_at_once_without_claiming_ready(tmp_path: Path) -> None:
    process = Up(tmp_path / "data", brokers=2, env=ENV)
    try:
        deadline = time.monotonic() + 15
        while not children_of(process.proc.pid) and time.monotonic() < deadline:  # a broker was just spawned
            time.sleep(0.005)
        spawned = children_of(process.proc.pid)
        assert spawned, "popgate up started no child"
        process.children = spawned
        assert process.stop(signal.SIGINT, timeout_s=15) == 130
        assert not [line for line in process.lines if line.startswith("ready ")], process.lines
        assert "popgate up: interrupted while starting; stopped" in process.lines
        assert process.left_behind(10) == []
    finally:
        process.kill_all()


def test_up_refuses_more_brokers_than_a_machine_runs_and_stops_while_spawning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """More brokers than `popgate up` runs on one machine is a usage error, nothing started; Ctrl-C as the first
    of 64 brokers is spawned stops the spawning there (it went on to spawn them all, then waited for each)."""
    assert main(["up", "--brokers", "65", "--no-view", "--data-dir", str(tmp_path / "none")]) == 2
    assert "--brokers must be 1 to 64" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()
    data = tmp_path / "data"
    process = Up(data, brokers=64, env=ENV)
    try:
        deadline = time.monotonic() + 15
        while not children_of(process.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert process.stop(signal.SIGINT, timeout_s=30) == 130
        assert "popgate up: interrupted while starting; stopped" in process.lines
        assert len(list(data.glob("b*.log"))) < 64  # one log per broker spawned
        assert process.left_behind(10) == []
    finally:
        process.kill_all()


def test_an_unusable_data_dir_fails_at_once_with_the_cause(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    argv = [POPGATE, "up", "--no-view", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "file" / "data")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=15, env=ENV, check=False)
    assert done.returncode == 1
    assert f"cannot create the data directory {tmp_path / 'file' / 'data'}: Not a directory" in done.stderr


def test_a_broker_that_exits_during_start_up_fails_it_with_its_last_output(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "b2").write_text("b2's data directory is a file")
    argv = [POPGATE, "up", "--brokers", "2", "--no-view", "--listen", "127.0.0.1:0", "--data-dir", str(data)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=15, env=ENV, check=False)
    assert done.returncode == 1
    assert "popgate up: b2 exited with code" in done.stderr
    assert str(data / "b2") in done.stderr  # from the broker's own last words


def test_the_environment_reaches_the_children_and_one_config_file_serves_them_all(tmp_path: Path) -> None:
    config = tmp_path / "popgate.toml"  # a proxy table in the file every child is given
    config.write_text("[proxy]\nmax-held-receives = 500\n[broker]\nmax-body-bytes = 100\n")
    env = dict(ENV, POPGATE_RECEIVE_MODE="notify", POPGATE_CONFIG=str(config))
    process = Up(tmp_path / "data", env=env)
    try:
        process.wait_ready(30)  # the broker did not refuse the proxy's table
        with Producer(process.endpoint) as producer:
            producer.send("up-env", b"x" * 100)
            with pytest.raises(MessageBodyTooLarge, match="limit of 100"):  # the broker read its own table
                producer.send("up-env", b"x" * 101)
        log = (tmp_path / "data" / "proxy.log").read_text()
        assert "(receive mode notify)" in log, log  # not overridden by a default of `up`'s own
        assert "WARNING proxy.server: authentication is off" in log, log  # served without accounts, said so
        assert process.stop(signal.SIGINT, timeout_s=20) == 0
    finally:
        process.kill_all()
