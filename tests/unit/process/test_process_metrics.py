"""Every server's registry carries the client library's process collectors and popgate_build_info."""

from __future__ import annotations

import platform

import grpc
from prometheus_client import CollectorRegistry, generate_latest

from popgate_process.metrics_http import register_process_metrics
from tests.deploy.metrics_contract import exposition_types


def test_process_metrics_and_build_info_are_registered_once() -> None:
    registry = CollectorRegistry()
    register_process_metrics(registry)
    register_process_metrics(registry)  # a second call adds nothing (no duplicated series)
    text = generate_latest(registry).decode()
    types = exposition_types(text)
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert types[name] in ("counter", "gauge"), name
    assert types["popgate_build_info"] == "gauge" and types["python_info"] == "gauge"
    samples = [line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")]
    assert samples.count("popgate_build_info") == 1 and samples.count("process_cpu_seconds_total") == 1
    build = registry.get_sample_value(
        "popgate_build_info", {"python": platform.python_version(), "grpc": grpc.__version__, "version": "0.1.0"}
    )
    assert build == 1.0
