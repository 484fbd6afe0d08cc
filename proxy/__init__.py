"""popgate's stateless gRPC proxy (apache.rocketmq.v2.MessagingService in front of the brokers)."""

import broker  # noqa: F401  grpc's I/O engine is chosen before grpc loads: broker/grpc_engine.py
