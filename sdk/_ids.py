"""The ids a client makes, in the official clients' formats: its client id, and its messages' ids.

Message ids stay unique across the processes a pre-forking server forks (each takes its own pid and a new
random counter start): consumers de-duplicate by id.
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
import threading
import time
import uuid

from ._forks import restarted_after_fork

_client_index = itertools.count()


def host_name() -> str:
    """This machine's name as gRPC metadata and a message's born_host can carry it: printable ASCII, at most 255
    characters ("hôte" → "h?te"; none → "localhost") — tests/unit/sdk/test_wire.py::
    test_a_host_name_that_is_not_ascii_is_sent_as_printable_ascii."""
    name = "".join(c if " " < c < "\x7f" else "?" for c in socket.gethostname())[:255]
    return name or "localhost"


HOST = host_name()


def new_client_id() -> str:
    """``hostname@pid@index@base36(time_ns)`` as the official clients build it."""
    n, digits = time.time_ns(), ""
    while n:
        n, r = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
    return f"{HOST}@{os.getpid()}@{next(_client_index)}@{digits}"


class MessageIds:
    """Ids in the official clients' format: 01 + MAC + pid + seconds since 2021 + counter (34 hex).

    The counter starts at a random value, and a forked child draws a new one (and takes its own pid):
    a generator made at import time is shared by every worker a pre-forking server (gunicorn,
    multiprocessing) forks, and those workers must not repeat each other's ids, since consumers
    de-duplicate by id.
    """

    _EPOCH_2021 = 1609459200

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._restart()
        _live_ids.add(self)

    def _restart(self) -> None:
        self._prefix = f"01{uuid.getnode():012X}{os.getpid() & 0xFFFF:04X}"
        self._counter = itertools.count(secrets.randbits(32))

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread of the parent may have held it at the fork
        self._restart()

    def __call__(self) -> str:
        return self.many(1)[0]

    def many(self, count: int) -> list[str]:
        """`count` new ids, made in the same second."""
        with self._lock:
            counts = list(itertools.islice(self._counter, count))
            prefix = self._prefix
        head = f"{prefix}{(int(time.time()) - self._EPOCH_2021) & 0xFFFFFFFF:08X}"
        return [f"{head}{n & 0xFFFFFFFF:08X}" for n in counts]


_live_ids = restarted_after_fork(MessageIds._after_fork)
