"""The signals a server process (broker, proxy) stops on, handled from the first statement of its `main`.

SIGTERM, SIGINT and SIGHUP (a closed terminal or ssh session) stop it gracefully; SIGUSR1 and SIGUSR2 are ignored
with a log line (nothing is reloaded on a signal). A signal that comes before the event loop runs is kept, not
lost — as PID 1 in a container an unhandled SIGTERM is dropped, and otherwise it kills the process unstopped — and
stops the process as soon as its start-up allows (docs/DEPLOY.md, "Signals"). A stop signal the process was started
with ignored stays ignored, as `nohup` (SIGHUP) and a shell's background job (SIGINT) mean it to be.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
IGNORED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


class StopSignals:
    """`install` first thing in `main` (before settings are read); `attach` once the event loop runs: its event is
    set by a stop signal from then on, and at once when one came before —
    tests/integration/process/test_signals.py."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._ignored: list[signal.Signals] = []
        self._stops: tuple[signal.Signals, ...] = STOP_SIGNALS

    def install(self) -> StopSignals:
        """From now on; a stop signal ignored when the process started stays so —
        tests/integration/process/test_signals.py::test_a_server_started_under_nohup_serves_on_after_sighup."""
        self._stops = tuple(sig for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN)
        for sig in self._stops:
            signal.signal(sig, self._early)
        for sig in IGNORED_SIGNALS:
            signal.signal(sig, self._early_ignored)
        return self

    def _early(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum)

    def _early_ignored(self, signum: int, frame: FrameType | None) -> None:
        self._ignored.append(signal.Signals(signum))

    def attach(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """The event a stop signal sets (handled on `loop` from now on, until it closes)."""
        stop = asyncio.Event()

        def stopping(sig: signal.Signals) -> None:
            if not stop.is_set():
                log.info("%s received: stopping", sig.name)
            stop.set()

        for sig in self._stops:
            loop.add_signal_handler(sig, stopping, sig)
        for sig in IGNORED_SIGNALS:
            loop.add_signal_handler(sig, _ignore, sig)
        for sig in self._ignored:
            _ignore(sig)
        self._ignored.clear()
        if self.received is not None:
            stopping(self.received)
        return stop


def _ignore(sig: signal.Signals) -> None:
    log.info("%s received: ignored (only SIGTERM, SIGINT and SIGHUP stop this process)", sig.name)
