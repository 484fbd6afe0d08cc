import broker  # noqa: F401  benchmark clients run on the I/O engine popgate's processes use (popgate_process.grpc_engine)
