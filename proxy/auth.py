"""Client authentication (v2 ``authorization`` header, HMAC-SHA1) and topic/group permissions. Sans-IO.

The official client signs only ``x-mq-date-time`` with ``HMAC-SHA1(key=secret)``
and sends ``MQv2-HMAC-SHA1 Credential=<AK>, SignedHeaders=x-mq-date-time,
Signature=<hex>``. Its date is *local* time suffixed ``Z``, so the server
cannot know the client's time zone: a date is fresh when it is within
``skew_s`` of now **shifted by some real time-zone offset** (a whole quarter
hour between UTC-12:00 and UTC+14:00; :30 and :45 zones exist). With a skew
below 7.5 minutes this rejects dates that are off by anything but a time-zone
shift; see docs/PROXY.md "Authentication".

No accounts configured = authentication off: every request is served, the
header (always sent, even with empty credentials) is ignored.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from popgate_contract.errors import Forbidden, Unauthorized

SCHEME = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"
ZONE_STEP_S = 15 * 60
MIN_ZONE_S = -12 * 3600
MAX_ZONE_S = 14 * 3600
PLACEHOLDER_PREFIX = "REPLACE-"  # deploy/k8s/overlays/prod/acl.example.toml's secrets
MIN_SECRET_CHARS = 16
VERIFIED_KEPT = 4096  # signatures verified, kept with their dates (`Authenticator.authenticate`)
# Metadata the proxy gives a call it refused at its headers (proxy/server.py), a `Refusal`: its handler refuses it
# with this reason. A client sending the key itself sends a plain str, which is ignored —
# tests/unit/proxy/test_auth.py::test_a_call_refused_at_its_headers_stays_refused_when_its_date_turns_fresh.
REFUSED_KEY = "popgate-refused-at-headers"


class Refusal(str):
    """Why the proxy refused a call at its headers, as only the proxy makes it."""


@dataclass(frozen=True, slots=True)
class Account:
    """One access key: what it may publish to, which topics it may consume, as which consumer groups, and
    whether it may use the admin service (`proxy/admin.py`).

    Patterns: an exact name, ``prefix*`` (names starting with prefix) or ``*`` (all).
    """

    access_key: str
    secret_key: str
    publish: tuple[str, ...] = ()  # topics
    subscribe: tuple[str, ...] = ()  # topics
    groups: tuple[str, ...] = ()  # consumer groups
    admin: bool = False

    def __repr__(self) -> str:  # never print the secret
        return (
            f"Account({self.access_key!r}, publish={self.publish}, subscribe={self.subscribe}, groups={self.groups}, "
            f"admin={self.admin})"
        )


def matches(patterns: Iterable[str], name: str) -> bool:
    """Whether a stored name is one of `patterns`: a name, ``*`` (every name), or a prefix and ``*``, whose ``*`` does
    not cross a namespace's ``%`` — ``orders-*`` is not tenant ``orders-eu``'s ``orders-eu%payments``; a tenant's are
    ``eu%*`` — test_auth.py::test_a_prefix_pattern_stays_within_its_namespace."""
    for pattern in patterns:
        if pattern == name or pattern == "*":
            return True
        if pattern.endswith("*") and name.startswith(prefix := pattern[:-1]) and "%" not in name[len(prefix) :]:
            return True
    return False


def sign(secret_key: str, date: str) -> str:
    """The official client's signature: lower-case hex HMAC-SHA1 of the date, keyed by the secret."""
    return hmac.new(secret_key.encode(), date.encode(), hashlib.sha1).hexdigest()


def authorization(access_key: str, secret_key: str, date: str) -> str:
    return f"{SCHEME} Credential={access_key}, SignedHeaders={DATE_HEADER}, Signature={sign(secret_key, date)}"


def parse_authorization(value: str) -> tuple[str, str]:
    """(access key, signature) from an ``authorization`` header value; Unauthorized when malformed."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme != SCHEME:
        raise Unauthorized(f"authorization: expected scheme {SCHEME}, got {scheme[:40]!r}")
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            fields[key.strip()] = val.strip()
    access_key, signature = fields.get("Credential", ""), fields.get("Signature", "")
    if not access_key or not signature:
        raise Unauthorized("authorization: Credential and Signature are required")
    return access_key, signature


def _parsed(date: str) -> float:
    """The date read as UTC, in seconds since the epoch; Unauthorized when it is not the client's format."""
    try:
        return calendar.timegm(time.strptime(date, DATE_FORMAT))
    except ValueError:
        raise Unauthorized(f"{DATE_HEADER}: {date[:40]!r} is not YYYYMMDDTHHMMSSZ") from None


def fresh(offset_s: float, skew_s: float) -> bool:
    """True when offset_s is within skew_s of a real time-zone offset (a quarter hour in UTC-12..UTC+14)."""
    zone = round(offset_s / ZONE_STEP_S) * ZONE_STEP_S
    zone = min(max(zone, MIN_ZONE_S), MAX_ZONE_S)
    return abs(offset_s - zone) <= skew_s


class Authenticator:
    """Checks a request's metadata against the configured accounts; off when there are none."""

    def __init__(
        self, accounts: Iterable[Account], *, skew_s: float = 300.0, clock: Callable[[], float] = time.time
    ) -> None:
        self._accounts = {a.access_key: a for a in accounts}
        self._skew_s = skew_s
        self._clock = clock
        self._verified: dict[tuple[str, str, str], tuple[Account, float]] = {}

    @property
    def enabled(self) -> bool:
        return bool(self._accounts)

    def authenticate(self, metadata: Mapping[str, str]) -> Account | None:
        """The caller's account (None when authentication is off); Unauthorized otherwise. A signature verified is
        kept (VERIFIED_KEPT of them) with its date: the same headers again, while fresh, are the same account without
        a second HMAC (a call is checked at its headers and again by its handler) —
        tests/unit/proxy/test_auth.py::test_verified_headers_are_kept_only_while_their_date_is_fresh."""
        if not self._accounts:
            return None
        refused = metadata.get(REFUSED_KEY)
        if isinstance(refused, Refusal):  # the proxy's own (a client's is a plain str): refused at the headers
            raise Unauthorized(refused)
        header = metadata.get("authorization")
        if not header:
            raise Unauthorized("authorization header missing: this proxy requires credentials")
        date = metadata.get(DATE_HEADER, "")
        access_key, signature = parse_authorization(header)
        key = (access_key, signature.lower(), date)
        kept = self._verified.get(key)
        if kept is not None and fresh(kept[1] - self._clock(), self._skew_s):
            return kept[0]
        account = self._accounts.get(access_key)
        if not date:
            raise Unauthorized(f"{DATE_HEADER} header missing")
        # Same work and the same answer whether the key is unknown or the signature wrong. Compared as bytes:
        # compare_digest refuses str with non-ASCII characters (a header byte 0xff arrives as U+FFFD).
        expected = sign(account.secret_key if account else "", date).encode()
        matches = hmac.compare_digest(expected, signature.lower().encode("utf-8", "replace"))
        if account is None or not matches:
            raise Unauthorized("unknown access key or bad signature")
        parsed = _parsed(date)
        if not fresh(parsed - self._clock(), self._skew_s):
            raise Unauthorized(f"{DATE_HEADER} {date} is too far from the proxy's clock (any time zone)")
        if len(self._verified) >= VERIFIED_KEPT:
            self._verified.clear()
        self._verified[key] = (account, parsed)
        return account


def authorize(
    account: Account | None, *, publish: Iterable[str] = (), subscribe: Iterable[str] = (), group: str = ""
) -> None:
    """Forbidden unless the account may publish to / subscribe to these topics (as this group)."""
    if account is None:
        return
    for topic in publish:
        if not matches(account.publish, topic):
            raise Forbidden(f"access key {account.access_key} may not publish to topic {topic}")
    for topic in subscribe:
        if not matches(account.subscribe, topic):
            raise Forbidden(f"access key {account.access_key} may not subscribe to topic {topic}")
    if group and not matches(account.groups, group):
        raise Forbidden(f"access key {account.access_key} may not consume as group {group}")


def _names(value: Any, what: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{what}: expected a list of topic/group names or patterns")
    return tuple(value)


def _check_secret(where: str, access_key: str, secret_key: str) -> None:
    """ValueError naming the access key, never the secret, when the secret is the example's placeholder or short —
    tests/unit/proxy/test_auth.py::test_a_placeholder_or_short_secret_is_refused_naming_the_key_not_the_secret."""
    why = ""
    if secret_key.startswith(PLACEHOLDER_PREFIX):
        why = "a placeholder"
    elif len(secret_key) < MIN_SECRET_CHARS:
        why = f"shorter than {MIN_SECRET_CHARS} characters"
    if why:
        raise ValueError(f"{where}: the secret_key of access key {access_key} is {why}: give it a random secret")


def accounts_from_config(entries: Any) -> tuple[Account, ...]:
    """``[[acl]]`` tables of the config file → accounts; ValueError naming what is wrong."""
    if not isinstance(entries, list):
        raise ValueError("acl: expected [[acl]] tables")
    accounts: list[Account] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"acl[{i}]: expected a table")
        unknown = sorted(set(entry) - {"access_key", "secret_key", "publish", "subscribe", "groups", "admin"})
        ak, sk = entry.get("access_key"), entry.get("secret_key")
        if unknown:
            raise ValueError(f"acl[{i}]: unknown keys {unknown}")
        if not isinstance(ak, str) or not ak or not isinstance(sk, str) or not sk:
            raise ValueError(f"acl[{i}]: access_key and secret_key (non-empty strings) are required")
        _check_secret(f"acl[{i}]", ak, sk)
        if any(a.access_key == ak for a in accounts):
            raise ValueError(f"acl[{i}]: access_key {ak} appears twice")
        lists = {k: _names(entry.get(k, []), f"acl[{i}].{k}") for k in ("publish", "subscribe", "groups")}
        admin = entry.get("admin", False)
        if not isinstance(admin, bool):
            raise ValueError(f"acl[{i}].admin: expected true or false")
        accounts.append(Account(ak, sk, **lists, admin=admin))
    return tuple(accounts)
