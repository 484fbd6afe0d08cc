"""popgate-proxy: read settings, configure logging, serve until SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from proxy.server import serve
from proxy.settings import SettingsError, load


async def _run(argv: Sequence[str] | None) -> None:
    settings = load(argv)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve(settings, stop, lambda address: print(f"ready {address}", file=sys.stderr, flush=True))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        asyncio.run(_run(argv))
    except SettingsError as exc:
        print(f"popgate-proxy: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
