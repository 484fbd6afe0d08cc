"""The `popgate` command (`popgate.cli.main`): `up`, send, receive, stats, dlq, bench.

A program of its own, not part of the library: it picks grpc's I/O engine for its process before grpc loads
(`popgate_process.grpc_engine`), as the broker and the proxy do.
"""

from popgate_process.grpc_engine import prefer_poller_io

prefer_poller_io()
