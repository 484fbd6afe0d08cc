"""The headers every v2 call carries: the client's language, version, id and namespace, the date, and with
credentials the MQv2-HMAC-SHA1 ``authorization`` that signs the date (the official clients' algorithm).
Sans-IO: no sockets, no grpc; the secret key is never sent nor shown in a repr.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from dataclasses import dataclass

CLIENT_VERSION = "5.1.2-popgate"


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key / secret key pair for the v2 ``authorization`` header (MQv2-HMAC-SHA1).

    Attributes:
        access_key: Sent in clear as ``Credential=``.
        secret_key: Never sent; keys the HMAC-SHA1 of the ``x-mq-date-time`` header.
    """

    access_key: str
    secret_key: str

    def __repr__(self) -> str:
        return f"Credentials(access_key={self.access_key!r}, secret_key=***)"


def signature(secret_key: str, date_time: str) -> str:
    """Lower-case hex HMAC-SHA1 of the date header keyed with the secret (the official clients' algorithm)."""
    return hmac.new(secret_key.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def authorization(credentials: Credentials, date_time: str) -> str:
    sig = signature(credentials.secret_key, date_time)
    return f"MQv2-HMAC-SHA1 Credential={credentials.access_key}, SignedHeaders=x-mq-date-time, Signature={sig}"


class CallMetadata:
    """The headers every v2 call carries; the date (and so the signature) is recomputed once a second."""

    def __init__(self, *, client_id: str, namespace: str = "", credentials: Credentials | None = None) -> None:
        self._fixed = (
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-client-version", CLIENT_VERSION),
            ("x-mq-client-id", client_id),
            ("x-mq-namespace", namespace),
        )
        self._credentials = credentials
        self._second = -1
        self._dated: tuple[tuple[str, str], ...] = ()

    def __call__(self, now: float | None = None) -> tuple[tuple[str, str], ...]:
        now = time.time() if now is None else now
        second = int(now)
        if second != self._second:
            date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second))
            dated: tuple[tuple[str, str], ...] = (("x-mq-date-time", date),)
            if self._credentials is not None:
                dated += (("authorization", authorization(self._credentials, date)),)
            self._dated, self._second = dated, second
        return (*self._fixed, *self._dated, ("x-mq-request-id", str(uuid.uuid4())))
