"""Whether the proxy serves one of popgate's extensions, as a client learns it from its calls (no I/O here)."""

from __future__ import annotations

import time
from typing import Any, overload

# How long a proxy's "not served" (UNIMPLEMENTED) holds before the next call asks again.
RECHECK_S = 60.0
clock = time.monotonic


class Served:
    """A client attribute: None until a call tells, True once the proxy served the extension, False once it said it
    serves none (UNIMPLEMENTED: a RocketMQ proxy, or a popgate proxy older than the extension), each caller then
    making the v2 call instead. False lasts RECHECK_S, then reads None for the one caller that reads it first (the
    others read False for another RECHECK_S), which asks again: a client whose proxies were upgraded behind the same
    address takes the extension up without a restart, and one whose proxy never serves it pays one refused call a
    minute, however many calls it makes at once — tests/unit/sdk/test_served.py,
    tests/integration/sdk/test_batch_receive.py::test_a_client_takes_the_extensions_up_once_its_proxy_serves_them."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._key = f"{name}_verdict"

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Served: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> bool | None: ...

    def __get__(self, instance: object | None, owner: type | None = None) -> Any:
        if instance is None:
            return self
        value, at, refused = instance.__dict__.get(self._key, (None, 0.0, False))
        if value is False and (now := clock()) - at >= RECHECK_S:
            instance.__dict__[self._key] = (False, now, refused)  # this caller asks; the others keep v2 meanwhile
            return None
        return value

    def __set__(self, instance: object, value: bool | None) -> None:
        old, _, refused = instance.__dict__.get(self._key, (None, 0.0, False))
        if value is True and old is True:
            return  # a call served as the ones before (each served call sets it)
        instance.__dict__[self._key] = (value, clock(), value is False or (refused and value is None))

    def peek(self, instance: object) -> bool | None:
        """The verdict as a read would give it, without taking the one ask after the minute: for a read that plans
        a call whose own read then asks (a send_many planning SharedSends) —
        tests/unit/sdk/test_served.py::test_a_planning_read_leaves_the_ask_to_the_call."""
        value, at, _ = instance.__dict__.get(self._key, (None, 0.0, False))
        return None if value is False and clock() - at >= RECHECK_S else value

    def refused_before(self, instance: object) -> bool:
        """Whether the proxy said it serves none, and has served it in no call since (the switch to v2 is then
        logged at INFO once, and again only after the extension was served meanwhile)."""
        return bool(instance.__dict__.get(self._key, (None, 0.0, False))[2])
