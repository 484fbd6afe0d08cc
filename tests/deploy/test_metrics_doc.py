"""docs/METRICS.md §4 names every metric a broker's and a proxy's /metrics export, as exported.

metrics_contract.py covers the names deploy/ reads; this covers the documented ones (a counter named
without its `_total`, a metric exported but not documented). The expositions come from the real
collectors, with no process: a broker core on a temporary store, a fresh ProxyMetrics.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from broker.metrics import BrokerMetrics
from popgate_process.metrics_http import register_process_metrics
from proxy.metrics import ProxyMetrics
from tests.deploy.conftest import ROOT
from tests.deploy.metrics_contract import exposition_types
from tests.unit.broker.cores import broker

_ROW = re.compile(r"^\| (`popgate_broker_[^|]*) \| (\w+) \|", re.M)
_NAME = re.compile(r"`(popgate_[a-z0-9_]+?)_?(?:\{[a-z,]+\})?`")


def _section() -> str:
    text = (ROOT / "docs" / "METRICS.md").read_text()
    return text[text.index("## 4. Metric names") : text.index("### Polling metrics the job reads")]


def documented_broker_metrics() -> dict[str, str]:
    """name -> type of each row of the broker table (`x_{count,sum,bucket}` is histogram x)."""
    return {name: kind for names, kind in _ROW.findall(_section()) for name in _NAME.findall(names)}


def documented_proxy_metrics() -> set[str]:
    paragraph = _section().split("Proxy (`proxy/metrics.py`", 1)[1].split("### Every process", 1)[0]
    return set(_NAME.findall(paragraph))


def documented_process_metrics() -> str:
    return _section().split("### Every process", 1)[1]


def exposed(text: str) -> dict[str, str]:
    return {name: kind for name, kind in exposition_types(text).items() if not name.endswith("_created")}


def broker_exposition(data: Path) -> str:
    async def scrape() -> str:
        async with broker(data) as (core, _):
            metrics = BrokerMetrics()
            metrics.watch(core)
            return generate_latest(metrics.registry).decode()

    return asyncio.run(asyncio.wait_for(scrape(), 10))


def test_the_broker_table_is_what_a_broker_exports(tmp_path: Path) -> None:
    assert documented_broker_metrics() == exposed(broker_exposition(tmp_path))


def test_the_proxy_paragraph_names_what_a_proxy_exports() -> None:
    metrics = ProxyMetrics()
    metrics.watch_brokers(lambda: [("b1", True)])  # registered by the proxy's entry point
    assert documented_proxy_metrics() == set(exposed(generate_latest(metrics.registry).decode()))


def test_the_process_section_names_what_every_process_adds() -> None:
    registry = CollectorRegistry()
    register_process_metrics(registry)
    text = documented_process_metrics()
    for name in exposed(generate_latest(registry).decode()):
        prefix = next((p for p in ("process_", "python_gc_") if name.startswith(p)), name)  # documented as `x_*`
        assert f"`{prefix}" in text, f"{name} is not named in docs/METRICS.md, 'Every process'"
