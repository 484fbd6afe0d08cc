"""popgate's own gRPC server on HTTP/2 (the h2 library): see server.py for why."""

from popgate_process.h2grpc.server import H2Server as H2Server
