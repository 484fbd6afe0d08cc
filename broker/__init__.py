"""popgate's pop broker: store, index, in-flight bookkeeping, long polling and its gRPC edge.

A broker is a process of its own; importing the package picks grpc's I/O engine for it first
(`popgate_process.grpc_engine`), before anything imports grpc.
"""

from popgate_process.grpc_engine import prefer_poller_io

prefer_poller_io()
