"""The `popgate` command (`popgate.cli.main`): `up`, send, receive, stats, dlq, bench.

A program of its own, not part of the library: it picks grpc's I/O engine for its process before grpc loads
(`popgate_process.grpc_engine`), as the broker and the proxy do.
"""

import os
import sys

from popgate_process.grpc_engine import prefer_poller_io

# The command says every failure itself, with its gRPC status code, on stderr beside its summaries; grpc core's
# own error lines would land among them (one at exit after Ctrl-C interrupts a held receive, on some runs) —
# tests/integration/sdk/test_cli.py::test_ctrl_c_during_receive_prints_the_summary. GRPC_VERBOSITY=ERROR (or
# any level an operator sets) brings them back. Only before grpc loads, as the engine choice.
OPERATOR_GRPC_VERBOSITY = os.environ.get("GRPC_VERBOSITY")  # set before the command ran: grpc's lines are wanted
if "grpc" not in sys.modules:
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
prefer_poller_io()
