"""The metric names that deploy/ (alert rules, dashboard) relies on, by process kind.

Brokers and proxies must export these (docs/METRICS.md); the live test checks
that they do, the static tests check that rules and dashboard use nothing else.
"""

from __future__ import annotations

import re

BROKER = {
    "popgate_broker_max_offset": "gauge",
    "popgate_broker_consumer_offset": "gauge",
    "popgate_broker_pull_offset": "gauge",
    "popgate_broker_consumer_lag_messages": "gauge",
    "popgate_broker_ready_messages": "gauge",
    "popgate_broker_inflight_messages": "gauge",
    "popgate_broker_oldest_unacked_age_seconds": "gauge",
    "popgate_broker_dlq_messages": "gauge",
    "popgate_broker_dead_lettered_total": "counter",
    "popgate_broker_held_requests": "gauge",
    "popgate_broker_messages_in_total": "counter",
    "popgate_broker_messages_out_total": "counter",
    "popgate_broker_rpc_duration_seconds": "histogram",
    "popgate_broker_store_commit_duration_seconds": "histogram",
    "popgate_broker_min_offset": "gauge",
    # Storage (issue 30)
    "popgate_broker_store_size_bytes": "gauge",
    "popgate_broker_disk_free_bytes": "gauge",
    "popgate_broker_disk_size_bytes": "gauge",
    "popgate_broker_tls_certificate_expiry_timestamp_seconds": "gauge",  # no series without TLS
    "popgate_build_info": "gauge",
}
PROXY = {
    "popgate_proxy_rpc_duration_seconds": "histogram",
    "popgate_proxy_broker_rpcs_total": "counter",
    "popgate_proxy_receives_total": "counter",
    "popgate_proxy_receive_first_pop_hits_total": "counter",
    "popgate_proxy_receive_latency_seconds": "histogram",
    # Receive modes (issue 5, docs/RECEIVE.md)
    "popgate_proxy_receive_mode_latency_seconds": "histogram",
    "popgate_proxy_long_polling_receives_total": "counter",
    "popgate_proxy_long_polls_moved_total": "counter",
    "popgate_proxy_answers_not_read_total": "counter",
    "popgate_proxy_notify_runs_total": "counter",
    "popgate_proxy_notifications_total": "counter",
    "popgate_proxy_notify_pops_total": "counter",
    "popgate_proxy_receive_mode_decisions_total": "counter",
    # On-call (issue 30): broker health as the proxy sees it, what consumers got
    "popgate_proxy_broker_up": "gauge",
    "popgate_proxy_messages_delivered_total": "counter",
    "popgate_proxy_delivered_bytes_total": "counter",
    "popgate_proxy_first_delivery_latency_seconds": "histogram",
    "popgate_proxy_acks_total": "counter",
    "popgate_proxy_tls_certificate_expiry_timestamp_seconds": "gauge",  # no series without TLS
    "popgate_build_info": "gauge",
}
KNOWN = BROKER | PROXY

# The labels rules and dashboard aggregate by (each sample carries at least these).
LABELS = {
    "popgate_broker_max_offset": {"topic", "queue"},
    "popgate_broker_consumer_offset": {"topic", "group"},  # "queue" too under --metrics-queue-offsets
    "popgate_broker_pull_offset": {"topic", "group"},
    "popgate_broker_consumer_lag_messages": {"topic", "group"},
    "popgate_broker_ready_messages": {"topic", "group"},
    "popgate_broker_inflight_messages": {"topic", "group"},
    "popgate_broker_oldest_unacked_age_seconds": {"topic", "group"},
    "popgate_broker_dlq_messages": {"group"},
    "popgate_broker_dead_lettered_total": {"topic", "group"},
    "popgate_broker_held_requests": {"kind"},
    "popgate_broker_messages_in_total": {"topic"},
    "popgate_broker_messages_out_total": {"topic", "group"},
    "popgate_broker_rpc_duration_seconds": {"method", "code"},
    "popgate_broker_store_commit_duration_seconds": set(),
    "popgate_broker_min_offset": {"topic", "queue"},
    "popgate_broker_store_size_bytes": set(),
    "popgate_broker_disk_free_bytes": set(),
    "popgate_broker_disk_size_bytes": set(),
    "popgate_build_info": {"version", "python", "grpc"},
    "popgate_proxy_rpc_duration_seconds": {"method", "code"},
    "popgate_proxy_broker_rpcs_total": {"broker", "method", "outcome"},
    "popgate_proxy_receives_total": {"group", "mode", "outcome"},
    "popgate_proxy_receive_first_pop_hits_total": {"group"},
    "popgate_proxy_receive_latency_seconds": set(),
    "popgate_proxy_receive_mode_latency_seconds": {"mode", "outcome"},
    "popgate_proxy_long_polling_receives_total": {"group"},
    "popgate_proxy_long_polls_moved_total": {"group"},
    "popgate_proxy_answers_not_read_total": {"group"},
    "popgate_proxy_notify_runs_total": {"group"},
    "popgate_proxy_notifications_total": {"group", "outcome"},
    "popgate_proxy_notify_pops_total": {"group", "kind"},
    "popgate_proxy_receive_mode_decisions_total": {"group", "mode", "reason"},
    "popgate_proxy_broker_up": {"broker"},
    "popgate_proxy_messages_delivered_total": {"topic", "group", "delivery"},
    "popgate_proxy_delivered_bytes_total": {"topic", "group"},
    "popgate_proxy_first_delivery_latency_seconds": {"topic", "group"},
    "popgate_proxy_acks_total": {"topic", "group", "outcome"},
    "popgate_proxy_tls_certificate_expiry_timestamp_seconds": {"certificate"},
    "popgate_broker_tls_certificate_expiry_timestamp_seconds": {"certificate"},
}
# What every server exports besides its own metrics (prometheus-client's default collectors), read by the dashboard.
PROCESS = {
    "process_cpu_seconds_total": "counter",
    "process_resident_memory_bytes": "gauge",
    "popgate_build_info": "gauge",
}

_NAME = re.compile(r"\bpopgate_[a-z0-9_]+")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')


def metric_names(expr: str) -> set[str]:
    """popgate_* metric names an expression reads, histogram suffixes folded in."""
    names = set()
    for name in _NAME.findall(expr):
        for suffix in ("_bucket", "_sum", "_count"):
            base = name.removesuffix(suffix)
            if base != name and KNOWN.get(base) == "histogram":
                name = base
        names.add(name)
    return names


def exposition_types(text: str) -> dict[str, str]:
    """`# TYPE name kind` lines of a Prometheus text exposition.

    prometheus-client names a counter `x` in TYPE lines for samples `x_total`.
    """
    types = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[:2] == ["#", "TYPE"]:
            name, kind = parts[2], parts[3]
            if kind == "counter" and not name.endswith("_total"):
                name += "_total"
            types[name] = kind
    return types


def sample_labels(text: str) -> dict[str, list[set[str]]]:
    """Label names of every sample in an exposition, by sample name."""
    samples: dict[str, list[set[str]]] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            samples.setdefault(match[1], []).append(set(_LABEL.findall(match[2] or "")))
    return samples


def missing_labels(text: str, expected: dict[str, str]) -> dict[str, set[str]]:
    """Contract labels absent from some sample of a metric (metrics without samples pass)."""
    samples = sample_labels(text)
    missing: dict[str, set[str]] = {}
    for name, kind in expected.items():
        sample = name + "_count" if kind == "histogram" else name
        for labels in samples.get(sample, []):
            if LABELS.get(name, set()) - labels:
                missing[name] = LABELS[name] - labels
    return missing
