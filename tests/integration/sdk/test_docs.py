"""Every ```python block of docs/SDK.md and README.md runs as written against a real cluster (endpoint
substituted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BLOCKS = [
    block
    for page in (ROOT / "README.md", ROOT / "docs" / "SDK.md")
    for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
]


def test_the_pages_have_examples() -> None:
    assert len(BLOCKS) >= 6


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs(index: int, endpoint: str, tmp_path: Path) -> None:
    script = tmp_path / f"example_{index}.py"
    script.write_text(BLOCKS[index].replace("127.0.0.1:8081", endpoint))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
