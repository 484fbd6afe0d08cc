"""The proxy's one settings object: flags > POPGATE_* environment > TOML config file > defaults.

Every option is listed once in OPTIONS; the command line, the environment and the
config file are all read through that list, then `Settings` validates the result.
"""

from __future__ import annotations

import argparse
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from proxy.auth import Account, accounts_from_config

RECEIVE_MODES = ("adaptive", "notify", "longpoll")
_BROKER_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class SettingsError(ValueError):
    """A setting is missing or out of range; the message names it."""


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    name: str
    target: str  # host:port; host may be a DNS name

    @classmethod
    def parse(cls, text: str) -> BrokerAddress:
        name, sep, target = text.strip().partition("=")
        if not sep or not _BROKER_NAME.match(name):
            raise SettingsError(f"--broker {text!r}: expected NAME=HOST:PORT with NAME matching [a-zA-Z0-9_-]{{1,64}}")
        parse_host_port(target, what=f"--broker {name}")
        return cls(name, target)


def parse_host_port(text: str, *, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SettingsError(f"{what}: {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class Settings:
    brokers: tuple[BrokerAddress, ...]
    listen: str = "127.0.0.1:8081"
    advertise: str = ""  # host:port clients should use when a request names no endpoints
    metrics_listen: str = ""
    export_dir: str = ""  # JSON-lines metric snapshots for the Spark job (docs/METRICS.md); empty = off
    export_interval_s: float = 10.0
    tls_cert: str = ""  # PEM certificate chain file; with tls_key: serve TLS instead of plaintext
    tls_key: str = ""  # PEM private key file
    receive_mode: str = "adaptive"
    # adaptive: longpoll when a group's receive rate (over the window) or its receives in progress per live broker
    # reach these; 0 switches a criterion off. Defaults from bench/realtime_bench.py, see docs/RECEIVE.md.
    adaptive_window_s: float = 1.0
    adaptive_rate_threshold: float = 0.0
    adaptive_concurrency_per_broker: float = 1.0
    # Proxies a group's consumers are spread over: the concurrency threshold is divided by it, so each proxy
    # judges the fleet-wide load from its own share (bench/sim, docs/SCALE.md). 1 = this proxy alone.
    adaptive_proxies: int = 1
    max_body_bytes: int = 4 * 1024 * 1024
    max_batch: int = 32
    queues_per_broker: int = 4
    min_invisible_s: float = 10.0
    max_invisible_s: float = 12 * 3600.0
    default_invisible_s: float = 60.0  # auto_renew / no invisible_duration (PushConsumer)
    min_long_polling_s: float = 0.0
    max_long_polling_s: float = 30.0
    default_long_polling_s: float = 20.0
    poll_reserve_s: float = 0.3
    max_delay_s: float = 24 * 3600.0
    broker_timeout_s: float = 3.0
    max_held_receives: int = 10_000  # receives in progress; more are TOO_MANY_REQUESTS
    max_send_bytes: int = 256 * 1024 * 1024  # bytes of sends in flight to brokers; more are TOO_MANY_REQUESTS
    send_chunk_bytes: int = 8 * 1024 * 1024  # body bytes per broker Send (below the broker's gRPC limit)
    health_interval_s: float = 1.0
    health_timeout_s: float = 0.5
    shutdown_grace_s: float = 5.0
    max_message_bytes: int = 64 * 1024 * 1024  # gRPC max receive size, > max_body_bytes
    log_level: str = "INFO"
    # Authentication (docs/PROXY.md "Authentication"): [[acl]] accounts from the config file; none = open.
    accounts: tuple[Account, ...] = ()
    auth_skew_s: float = 300.0  # clock skew allowed around any time-zone offset of x-mq-date-time
    broker_token: str = ""  # shared secret sent to brokers started with the same --auth-token

    def __post_init__(self) -> None:
        if not self.brokers:
            raise SettingsError("at least one --broker NAME=HOST:PORT is required")
        names = [b.name for b in self.brokers]
        if len(set(names)) != len(names):
            raise SettingsError(f"--broker names must be unique, got {names}")
        parse_host_port(self.listen, what="--listen")
        for name in ("advertise", "metrics_listen"):
            if getattr(self, name):
                parse_host_port(getattr(self, name), what=f"--{name.replace('_', '-')}")
        if self.receive_mode not in RECEIVE_MODES:
            raise SettingsError(f"--receive-mode {self.receive_mode!r}: choose one of {', '.join(RECEIVE_MODES)}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError("--tls-cert and --tls-key go together: give both for TLS, neither for plaintext")
        for name in ("tls_cert", "tls_key"):
            if getattr(self, name) and not Path(getattr(self, name)).is_file():
                raise SettingsError(f"--{name.replace('_', '-')} {getattr(self, name)}: no such file")
        self._check_ranges()

    def _check_ranges(self) -> None:
        checks = [
            ("max_body_bytes", 1 <= self.max_body_bytes < self.max_message_bytes, "1 <= it < max_message_bytes"),
            ("max_batch", 1 <= self.max_batch <= 32, "1..32"),
            ("queues_per_broker", 1 <= self.queues_per_broker <= 1024, "1..1024"),
            ("min_invisible_s", 0 < self.min_invisible_s <= self.max_invisible_s, "0 < it <= max_invisible_s"),
            (
                "default_invisible_s",
                self.min_invisible_s <= self.default_invisible_s <= self.max_invisible_s,
                "within min_invisible_s..max_invisible_s",
            ),
            (
                "min_long_polling_s",
                0 <= self.min_long_polling_s <= self.max_long_polling_s,
                "0 <= it <= max_long_polling_s",
            ),
            (
                "default_long_polling_s",
                self.min_long_polling_s <= self.default_long_polling_s <= self.max_long_polling_s,
                "within min_long_polling_s..max_long_polling_s",
            ),
            ("poll_reserve_s", 0 <= self.poll_reserve_s < 5, "0..5"),
            ("max_delay_s", self.max_delay_s > 0, "> 0"),
            ("broker_timeout_s", self.broker_timeout_s > 0, "> 0"),
            ("max_held_receives", self.max_held_receives >= 1, ">= 1"),
            ("max_send_bytes", self.max_send_bytes >= 1024, ">= 1024"),
            ("send_chunk_bytes", self.send_chunk_bytes >= self.max_body_bytes, ">= max_body_bytes"),
            ("health_interval_s", self.health_interval_s > 0, "> 0"),
            ("health_timeout_s", 0 < self.health_timeout_s, "> 0"),
            ("shutdown_grace_s", self.shutdown_grace_s >= 0, ">= 0"),
            ("export_interval_s", self.export_interval_s > 0, "> 0"),
            ("auth_skew_s", 0 < self.auth_skew_s <= 3600, "0 < it <= 3600"),
            ("adaptive_window_s", 0 < self.adaptive_window_s <= 3600, "0 < it <= 3600"),
            ("adaptive_rate_threshold", self.adaptive_rate_threshold >= 0, ">= 0 (0 = criterion off)"),
            ("adaptive_concurrency_per_broker", self.adaptive_concurrency_per_broker >= 0, ">= 0 (0 = criterion off)"),
            ("adaptive_proxies", self.adaptive_proxies >= 1, ">= 1"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise SettingsError(f"{name}={getattr(self, name)!r} out of range: must be {rule}")


def _str_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [part for part in value.replace(",", " ").split() if part]
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    raise SettingsError(f"expected a list of strings, got {value!r}")


def _brokers(value: Any) -> tuple[BrokerAddress, ...]:
    return tuple(BrokerAddress.parse(item) for item in _str_list(value))


_CONVERT: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "str": str}


def _fields() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(Settings) if f.name not in ("brokers", "accounts")}


def _convert(name: str, kind: str, value: Any) -> Any:
    try:
        return _CONVERT[kind](value)
    except (TypeError, ValueError):
        raise SettingsError(f"{name}={value!r}: expected {kind}") from None


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Settings)}


def build_parser(prog: str = "popgate-proxy") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="popgate RocketMQ v2 gRPC proxy")
    parser.add_argument("--config", help="TOML config file (keys as the long flags, '-' or '_')")
    parser.add_argument("--broker", action="append", help="NAME=HOST:PORT, repeated (env POPGATE_BROKER: comma list)")
    for name, kind in _fields().items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{kind}, default {_DEFAULTS[name]!r}"
        if name == "receive_mode":
            help_text = f"one of {', '.join(RECEIVE_MODES)}, default adaptive (docs/RECEIVE.md)"
        parser.add_argument(flag, dest=name, default=None, help=help_text)
    return parser


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the command line, the environment and the config file, validated."""
    args = build_parser().parse_args(argv)
    env = os.environ if env is None else env
    config_path = args.config or env.get("POPGATE_CONFIG")
    config = _read_config(Path(config_path)) if config_path else {}
    values: dict[str, Any] = {}
    for name, kind in {**_fields(), "broker": "brokers"}.items():
        raw = getattr(args, name)
        if raw is None:
            raw = env.get("POPGATE_" + name.upper())
        if raw is None:
            raw = config.get(name)
        if raw is None:
            continue
        if name == "broker":
            values["brokers"] = _brokers(raw)
        else:
            values[name] = _convert(name, kind, raw)
    values.setdefault("brokers", ())
    if "acl" in config:
        try:
            values["accounts"] = accounts_from_config(config["acl"])
        except ValueError as exc:
            raise SettingsError(f"--config {config_path}: {exc}") from None
    return Settings(**values)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"--config {path}: {exc}") from None
    table = data.get("proxy", data)
    if not isinstance(table, dict):
        raise SettingsError(f"--config {path}: [proxy] must be a table")
    out = {str(k).replace("-", "_"): v for k, v in table.items()}
    if "acl" in data:  # [[acl]] at the top level, beside or without a [proxy] table
        out["acl"] = data["acl"]
    if "brokers" in out:
        out["broker"] = out.pop("brokers")
    known = set(_fields()) | {"broker", "acl"}
    unknown = sorted(set(out) - known)
    if unknown:
        raise SettingsError(f"--config {path}: unknown keys {unknown}")
    return out
