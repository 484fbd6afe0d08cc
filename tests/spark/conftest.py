"""Spark tests share one local session (tests/spark/session.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed: pip install -e '.[spark]'")

from tests.spark.session import spark  # noqa: E402,F401
