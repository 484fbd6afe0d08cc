"""popgate's Python SDK: a Producer and a SimpleConsumer over the apache.rocketmq.v2 protocol.

Blocking classes are here; their asyncio twins are in `popgate.aio`. Errors are in `popgate.errors`.
The SDK never configures logging (it logs to ``logging.getLogger("popgate....")``) and changes nothing
process-wide when imported: the names below load their modules on first use, so a program (the
`popgate` command, `popgate.cli`) can still choose grpc's settings before grpc loads
(tests/integration/sdk/test_standalone.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._metadata import Credentials
    from .client import Producer, SimpleConsumer
    from .errors import (
        AckError,
        BadRequest,
        InvalidReceiptHandle,
        MessageBodyTooLarge,
        NackError,
        NotFound,
        PopgateError,
        ServerError,
        Timeout,
        TooManyRequests,
        TransactionError,
        Unauthorized,
        Unavailable,
        Unsupported,
    )
    from .message import Message, SendReceipt
    from .retry import RetryPolicy
    from .transactions import Checker, Transaction

_HOME = {
    "Credentials": "_metadata",
    "Producer": "client",
    "SimpleConsumer": "client",
    "Message": "message",
    "SendReceipt": "message",
    "RetryPolicy": "retry",
    "Checker": "transactions",
    "Transaction": "transactions",
    **dict.fromkeys(
        (
            "AckError",
            "BadRequest",
            "InvalidReceiptHandle",
            "MessageBodyTooLarge",
            "NackError",
            "NotFound",
            "PopgateError",
            "ServerError",
            "Timeout",
            "TooManyRequests",
            "TransactionError",
            "Unauthorized",
            "Unavailable",
            "Unsupported",
        ),
        "errors",
    ),
}
__all__ = [
    "AckError",
    "BadRequest",
    "Checker",
    "Credentials",
    "InvalidReceiptHandle",
    "Message",
    "MessageBodyTooLarge",
    "NackError",
    "NotFound",
    "PopgateError",
    "Producer",
    "RetryPolicy",
    "SendReceipt",
    "ServerError",
    "SimpleConsumer",
    "Timeout",
    "TooManyRequests",
    "Transaction",
    "TransactionError",
    "Unauthorized",
    "Unavailable",
    "Unsupported",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'popgate' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
