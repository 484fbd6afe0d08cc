"""popgate's Python SDK: a Producer and a SimpleConsumer over the apache.rocketmq.v2 protocol.

Blocking classes are here; their asyncio twins are in `sdk.aio`. Errors are in `sdk.errors`.
The SDK never configures logging: it logs to ``logging.getLogger("sdk....")``.
"""

import broker  # noqa: F401  grpc's I/O engine is chosen before grpc loads: broker/grpc_engine.py
from sdk._wire import Credentials
from sdk.client import Producer, SimpleConsumer
from sdk.errors import (
    AckError,
    BadRequest,
    InvalidReceiptHandle,
    MessageBodyTooLarge,
    NotFound,
    PopgateError,
    ServerError,
    Timeout,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    Unsupported,
)
from sdk.message import Message, SendReceipt
from sdk.retry import RetryPolicy

__all__ = [
    "AckError",
    "BadRequest",
    "Credentials",
    "InvalidReceiptHandle",
    "Message",
    "MessageBodyTooLarge",
    "NotFound",
    "PopgateError",
    "Producer",
    "RetryPolicy",
    "SendReceipt",
    "ServerError",
    "SimpleConsumer",
    "Timeout",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "Unsupported",
]
