"""docs/SDK.md's "gRPC I/O engine" gives an application the value popgate's own programs set."""

from __future__ import annotations

import re
from pathlib import Path

from popgate_process.grpc_engine import POLLER_IO

SDK_MD = Path(__file__).resolve().parents[3] / "docs" / "SDK.md"


def test_the_sdk_page_gives_the_poller_value_popgate_programs_use() -> None:
    section = SDK_MD.read_text().split("## gRPC I/O engine\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert f'"{POLLER_IO}"' in block
    assert "GRPC_EXPERIMENTS=" in section
