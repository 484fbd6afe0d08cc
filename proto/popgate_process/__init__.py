"""Plumbing of popgate's server processes (broker, proxy) and of `popgate up`: settings loading, the metrics HTTP
server, export files, memory trimming and the choice of grpc's I/O engine.

The SDK library never imports it (`make lint` checks); what processes must agree on is `popgate_contract`.
"""
