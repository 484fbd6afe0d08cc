"""The servers' event loop: asyncio's, with accepting connections bounded when the process is out of descriptors.

On EMFILE, ENFILE, ENOBUFS or ENOMEM, asyncio 3.11's selector loop stops watching the listening socket and retries in
a second, but its accept loop goes on: up to its backlog (100) retries are scheduled per readable event, each of which
schedules as many again, so a process held at its descriptor limit spends its CPU on them and logs a traceback for
each. Here the first such failure of an event ends it (one retry), and the failure is logged without a traceback at
most once every `OUT_OF_RESOURCES_LOG_S`, with how many were left out — tests/integration/proxy/
test_out_of_descriptors.py::test_a_proxy_out_of_descriptors_stays_quiet_serves_its_clients_and_recovers.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Coroutine
from typing import Any, TypeVar

from popgate_process.throttled import Throttled

log = logging.getLogger(__name__)
T = TypeVar("T")
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
OUT_OF_RESOURCES_LOG_S = 10.0


class ServerLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._refused = Throttled(log.error, OUT_OF_RESOURCES_LOG_S)

    def _accept_connection(
        self,
        protocol_factory: Any,
        sock: socket.socket,
        sslcontext: Any = None,
        server: Any = None,
        backlog: int = 100,
        *timeouts: Any,
    ) -> None:
        """asyncio's (`BaseSelectorEventLoop._accept_connection`), but a refusal for resources ends the call: the
        socket is no longer watched and one retry is scheduled, in a second."""
        fd = sock.fileno()
        for _ in range(backlog):
            try:
                conn, addr = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in OUT_OF_RESOURCES:
                    raise
                self._refused(
                    "cannot accept connections: %s (retried every second; raise the process's descriptor limit "
                    "or lower its clients)",
                    exc.strerror or exc,
                )
                self._remove_reader(fd)  # type: ignore[attr-defined]
                restart = self._start_serving  # type: ignore[attr-defined]
                self.call_later(1.0, restart, protocol_factory, sock, sslcontext, server, backlog, *timeouts)
                return
            conn.setblocking(False)
            extra = {"peername": addr}
            accepted = self._accept_connection2  # type: ignore[attr-defined]
            self.create_task(accepted(protocol_factory, conn, extra, sslcontext, server, *timeouts))


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a `ServerLoop`."""
    with asyncio.Runner(loop_factory=ServerLoop) as runner:
        return runner.run(main)
