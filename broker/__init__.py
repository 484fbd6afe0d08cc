"""popgate's broker. Importing any of popgate (broker, proxy, sdk) first picks grpc's I/O engine."""

from broker.grpc_engine import prefer_poller_io

prefer_poller_io()
