"""Which of grpc-python's I/O engines popgate's processes run on, chosen before grpc is imported.

grpcio 1.85 moves socket I/O to its EventEngine (a thread pool that hands each read and write to
grpc's completion queue). On this 2-core machine its older poller (epoll on the completion
queue's own thread) measured better on every path popgate cares about (docs/PROXY.md, "gRPC I/O
engine", alternated on one commit): proxy consume+ack 6.6-6.8k -> 8.5-8.6k msg/s, a unary call
after 20 ms of idleness ~0.2 ms faster, idle CPU of 10,000 held receives 1.9 % -> 1.7 %.

grpc reads ``GRPC_EXPERIMENTS`` once, when ``grpc`` is first imported, so this runs at the top of
each entry point (broker, proxy, the SDK package) and does nothing when grpc is already imported
or the variable is set (an operator's own choice wins; ``GRPC_EXPERIMENTS=`` keeps grpc's default).
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
        # grpc core's own INFO lines (a failed TLS handshake, a port in use: eight raw lines before the one the
        # command prints) reach stderr unless this is set before grpc loads; errors still do. An operator's or
        # a user's own GRPC_VERBOSITY wins.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
