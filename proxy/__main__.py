"""popgate-proxy: read settings, configure logging (text or JSON lines on stderr), serve until a stop signal
(popgate_process.stop_signals)."""

from __future__ import annotations

import asyncio
import ctypes
import sys
from collections.abc import Sequence

from popgate_process import event_loop
from popgate_process.collector import collect_less_often
from popgate_process.logs import configure_logging
from popgate_process.stop_signals import StopSignals
from proxy.server import serve
from proxy.settings import SettingsError, load

M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def return_large_buffers_to_the_os(threshold: int = 128 * 1024) -> bool:
    """Keep glibc's mmap threshold fixed, so message buffers above it (bodies up to 4 MiB) are mapped
    on their own and unmapped when freed. By default glibc raises the threshold after the first such
    free, and later bursts of large sends would leave their buffers in the heap, the proxy's RSS growing with
    each flood — tests/integration/test_overload.py::
    test_a_flood_beyond_the_bounds_is_refused_with_42900_and_memory_stays_bounded. No-op where there is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False


async def _run(argv: Sequence[str] | None, signals: StopSignals) -> None:
    stop = signals.attach(asyncio.get_running_loop())
    settings = load(argv)
    configure_logging(settings.log_level, settings.log_format)  # --log-level, --log-format text|json
    await serve(settings, stop, lambda address: print(f"ready {address}", file=sys.stderr, flush=True))


def main(argv: Sequence[str] | None = None) -> int:
    signals = StopSignals().install()  # before anything slow: a stop signal is never lost nor kills it unstopped
    return_large_buffers_to_the_os()
    collect_less_often()
    try:
        event_loop.run(_run(argv, signals))
    except SettingsError as exc:
        print(f"popgate-proxy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
