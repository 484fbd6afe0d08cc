"""Spark tests share one local session (tests/spark/session.py)."""

from __future__ import annotations

import pytest

try:  # required, not optional: make test installs it
    import pyspark  # noqa: F401
except ImportError:
    pytest.fail("pyspark is not installed: pip install -e '.[spark]' (make test installs it)", pytrace=False)

from tests.spark.session import spark  # noqa: E402,F401
