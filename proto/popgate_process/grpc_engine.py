"""Which of grpc-python's I/O engines popgate's processes run on, chosen before grpc is imported.

grpcio 1.85 moves socket I/O to its EventEngine (a thread pool that hands each read and write to
grpc's completion queue); popgate's processes run on its older poller (epoll on the completion
queue's own thread), the faster of the two for them (docs/PROXY.md, "gRPC I/O engine", has the figures).

grpc reads ``GRPC_EXPERIMENTS`` once, when ``grpc`` is first imported, so this runs at the top of
each program's package (broker, proxy, the `popgate` command; never the SDK library, which changes
nothing process-wide) and does nothing when grpc is already imported or the variable is set (an
operator's own choice wins; ``GRPC_EXPERIMENTS=`` keeps grpc's default).
"""

from __future__ import annotations

import os
import sys

POLLER_IO = (
    "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints,-event_engine_callback_cq"
)


def prefer_poller_io() -> None:
    if "grpc" not in sys.modules:
        os.environ.setdefault("GRPC_EXPERIMENTS", POLLER_IO)
        # grpc core's own INFO lines (a failed TLS handshake, a port in use) reach stderr before the one line the
        # program prints unless this is set before grpc loads; errors still do. An operator's own GRPC_VERBOSITY
        # wins.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
        # popgate's programs fork only to exec (a cluster's children, a test run's Spark JVM). grpc's fork handlers
        # start a poller thread in such a child, which can abort it before its exec when the child closes its
        # descriptors (a preexec_fn makes Python fork and close them; grpc/grpc issue 43055) —
        # tests/integration/process/test_fork_exec.py::test_children_forked_beside_live_grpc_channels_all_exec.
        os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
