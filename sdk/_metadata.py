"""The headers every v2 call carries: the client's language, version, id and namespace, the date, and with
credentials the MQv2-HMAC-SHA1 ``authorization`` that signs the date (the official clients' algorithm).
Sans-IO: no sockets, no grpc; the secret key is never sent nor shown in a repr.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ._forks import restarted_after_fork

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
    """The headers every v2 call carries; the date (and so the signature) is recomputed once a second.

    A `client_id` given as a function is called for this process's id, and again in a forked child: a child's
    calls never carry its parent's id, so the proxy tells the two apart —
    tests/unit/sdk/test_fork.py::test_a_forked_childs_calls_carry_a_client_id_of_its_own."""

    def __init__(
        self, *, client_id: str | Callable[[], str], namespace: str = "", credentials: Credentials | None = None
    ) -> None:
        self._client_id = client_id
        self._namespace = namespace
        self._credentials = credentials
        self._restart()
        if callable(client_id):
            _live_metadata.add(self)

    def _restart(self) -> None:
        client_id = self._client_id() if callable(self._client_id) else self._client_id
        self._fixed = (
            ("x-mq-language", "PYTHON"),
            ("x-mq-protocol", "GRPC_V2"),
            ("x-mq-client-version", CLIENT_VERSION),
            ("x-mq-client-id", client_id),
            ("x-mq-namespace", self._namespace),
        )
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


_live_metadata = restarted_after_fork(CallMetadata._restart)
