import broker  # noqa: F401  benchmark clients run on the I/O engine popgate's own clients use (broker/grpc_engine.py)
