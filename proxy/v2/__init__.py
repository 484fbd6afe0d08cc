"""The apache.rocketmq.v2 gRPC edge: servicer, per-RPC-family handlers and message conversion."""
