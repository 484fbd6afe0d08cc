"""The signals a broker and a proxy get: a stop signal stops them gracefully from the first moment of their start
(during it, the start ends cleanly and they never serve); SIGHUP stops them as SIGTERM does; SIGUSR1/2 are
ignored with a log line (docs/DEPLOY.md, "Signals")."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.sqlite_store import SqliteStore
from tests.procs import ServerProcess, broker_args, wait_until

PROXY_ARGS = ["--listen", "127.0.0.1:0", "--broker", "b1=127.0.0.1:1"]

# A start made slow at a step of its own (the store's open or load of a large store; the proxy's settings read),
# said on stderr when that step begins. The broker's slow step is its first argument: "open" or "load".
SLOW_BROKER = textwrap.dedent(
    """
    import sys, time
    from broker.sqlite_store import SqliteStore
    slow_step, real_init, real_load = sys.argv.pop(1), SqliteStore.__init__, SqliteStore.load
    def step(said, name):
        print(said, file=sys.stderr, flush=True)
        if name == slow_step:
            time.sleep(3)
    def init(self, *args, **kwargs):
        step("opening the store", "open")
        real_init(self, *args, **kwargs)
    def load(self):
        step("reading the store", "load")
        return real_load(self)
    SqliteStore.__init__, SqliteStore.load = init, load
    from broker.__main__ import main
    main(sys.argv[1:])
    """
)
SLOW_PROXY = textwrap.dedent(
    """
    import sys, time
    import proxy.__main__ as entry
    real = entry.load
    def slow(argv):
        print("reading the settings", file=sys.stderr, flush=True)
        time.sleep(3)
        return real(argv)
    entry.load = slow
    raise SystemExit(entry.main(sys.argv[1:]))
    """
)


@contextlib.contextmanager
def stop_signals_default() -> Iterator[None]:
    """Children started meanwhile get SIGHUP and SIGINT as a terminal's process does, whatever this test run was
    started with: under `nohup` or as a shell's background job they would inherit them ignored, and a server keeps
    a stop signal it started with ignored (test_a_server_started_under_nohup_serves_on_after_sighup)."""
    before = {sig: signal.signal(sig, signal.SIG_DFL) for sig in (signal.SIGHUP, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


class Started:
    """A program run with its stderr gathered line by line."""

    def __init__(self, program: str, args: list[str]) -> None:
        with stop_signals_default():
            self.proc = subprocess.Popen(
                [sys.executable, "-c", program, *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
            )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def end(self, timeout_s: float = 15.0) -> int:
        rc = self.proc.wait(timeout_s)
        self.close()
        return rc

    def close(self) -> None:
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def started() -> Iterator[list[Started]]:
    runs: list[Started] = []
    yield runs
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()
        run.close()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_stop_while_the_store_is_read_ends_the_start(tmp_path: Path, started: list[Started], sig: str) -> None:
    """A broker told to stop while it reads its store (minutes for a large one) does not go on to serve, nor die
    unstopped: once the load returns it closes the store and exits 0, the data directory free and whole."""
    data = tmp_path / "b1"
    broker = Started(SLOW_BROKER, ["load", *broker_args("b1", data, "--topic", "orders")])
    started.append(broker)
    assert wait_until(lambda: broker.said("reading the store"), timeout=30), broker.lines
    broker.proc.send_signal(signal.Signals[sig])
    assert broker.end() == 0, broker.lines
    assert not any(line.startswith("ready ") for line in broker.lines)
    assert broker.said("stopped before serving") and not broker.said("Traceback")

    async def reopen() -> None:
        store = SqliteStore(data)  # the LOCK is free and the database whole
        store.load()
        await store.close()

    asyncio.run(reopen())


def test_a_stop_while_the_store_opens_ends_the_start_before_the_load(tmp_path: Path, started: list[Started]) -> None:
    """A SIGTERM while the broker opens its store (a layout migration: minutes) ends the start once the open returns:
    the store is closed without being read, exit 0, never ready."""
    data = tmp_path / "b1"
    broker = Started(SLOW_BROKER, ["open", *broker_args("b1", data, "--topic", "orders")])
    started.append(broker)
    assert wait_until(lambda: broker.said("opening the store"), timeout=30), broker.lines
    broker.proc.send_signal(signal.SIGTERM)
    assert broker.end() == 0, broker.lines
    assert not broker.said("reading the store"), broker.lines
    assert not any(line.startswith("ready ") for line in broker.lines)
    assert broker.said("stopped before serving") and not broker.said("Traceback")
    store = SqliteStore(data)  # the LOCK is free
    asyncio.run(store.close())


def test_a_stop_while_the_proxy_starts_ends_the_start(started: list[Started]) -> None:
    """A SIGTERM as soon as the proxy's main has begun (its settings not read yet) stops it: exit 0, never ready."""
    proxy = Started(SLOW_PROXY, PROXY_ARGS)
    started.append(proxy)
    assert wait_until(lambda: proxy.said("reading the settings"), timeout=30), proxy.lines
    proxy.proc.send_signal(signal.SIGTERM)
    assert proxy.end() == 0, proxy.lines
    assert not any(line.startswith("ready ") for line in proxy.lines)
    assert proxy.said("stopped before serving") and not proxy.said("Traceback")


def _server(kind: str, tmp_path: Path, *, nohup: bool = False) -> ServerProcess:
    """A broker or a proxy started as from a terminal, or (`nohup`) with SIGHUP ignored, as nohup starts it."""
    args = broker_args("b1", tmp_path / "b1") if kind == "broker" else PROXY_ARGS
    with stop_signals_default():
        if nohup:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        return ServerProcess(kind, args).start()


@pytest.mark.parametrize("kind", ["broker", "proxy"])
def test_sighup_stops_a_server_gracefully(tmp_path: Path, kind: str) -> None:
    """A closed terminal or ssh session (SIGHUP) stops a server as SIGTERM does: held requests answered, exit 0."""
    server = _server(kind, tmp_path)
    try:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
        assert server.proc.wait(15) == 0, server.lines
        assert wait_until(lambda: any("SIGHUP received: stopping" in line for line in server.lines), timeout=5)
        assert any("stopping: answering held" in line for line in server.lines), server.lines
    finally:
        server.kill()


@pytest.mark.parametrize("kind", ["broker", "proxy"])
def test_sigusr1_and_sigusr2_are_ignored_with_a_log_line(tmp_path: Path, kind: str) -> None:
    """An operator expecting a reload (SIGUSR1/2) does not kill a server: it logs the signal and serves on."""
    server = _server(kind, tmp_path)
    try:
        assert server.proc is not None
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            server.proc.send_signal(sig)
            assert wait_until(lambda s=sig: any(f"{s.name} received: ignored" in line for line in server.lines))
        assert server.alive()
        assert server.stop() == 0
    finally:
        server.kill()


@pytest.mark.parametrize("kind", ["broker", "proxy"])
def test_a_server_started_under_nohup_serves_on_after_sighup(tmp_path: Path, kind: str) -> None:
    """`nohup popgate-broker &` starts it with SIGHUP ignored, so that it outlives the terminal: the logout's SIGHUP
    neither stops it nor is logged. (The SIGUSR1 sent after it is handled after it: its line says SIGHUP was.)"""
    server = _server(kind, tmp_path, nohup=True)
    try:
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
        server.proc.send_signal(signal.SIGUSR1)
        assert wait_until(lambda: any("SIGUSR1 received: ignored" in line for line in server.lines))
        assert server.alive()
        assert not any("SIGHUP received" in line for line in server.lines), server.lines
        assert server.stop() == 0
    finally:
        server.kill()
