"""Fixtures of the process tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from popgate_process.h2grpc import H2Server
from tests.integration.process.h2grpc_served import Handlers, started


@pytest.fixture
async def server() -> AsyncIterator[tuple[H2Server, Handlers, str]]:
    served = await started(max_calls=256)
    yield served
    await served[0].stop(None)
