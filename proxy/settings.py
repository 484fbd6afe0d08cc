"""The proxy's one settings object: flags > POPGATE_* environment > TOML config file > defaults.

Every option is a field of `Settings`; `popgate_process.config` (the broker's loader too)
reads the command line, the environment and the config file through those fields,
then `Settings` validates the result. The file's keys may sit in a ``[proxy]``
table; ``[[acl]]`` accounts come from the file only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from popgate_contract.validation import parse_host_port as parse_host_port
from popgate_process.config import SettingsError as SettingsError
from popgate_process.config import load as load_config
from popgate_process.config import settings_parser
from proxy.auth import Account, accounts_from_config

RECEIVE_MODES = ("adaptive", "notify", "longpoll")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_BROKER_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    name: str
    target: str  # host:port; host may be a DNS name

    @classmethod
    def parse(cls, text: str) -> BrokerAddress:
        name, sep, target = text.strip().partition("=")
        if not sep or not _BROKER_NAME.fullmatch(name):
            raise SettingsError(f"--broker {text!r}: expected NAME=HOST:PORT with NAME matching [a-zA-Z0-9_-]{{1,64}}")
        parse_host_port(target, what=f"--broker {name}")
        return cls(name, target)


def _str_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [part for part in value.replace(",", " ").split() if part]
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    raise SettingsError(f"expected a list of strings, got {value!r}")


def _brokers(value: Any) -> tuple[BrokerAddress, ...]:
    return tuple(BrokerAddress.parse(item) for item in _str_list(value))


@dataclass(frozen=True, slots=True)
class Settings:
    brokers: tuple[BrokerAddress, ...] = field(
        default=(),
        metadata={
            "option": "broker",
            "aliases": ("brokers",),
            "parse": _brokers,
            "help": "NAME=HOST:PORT, repeated (env POPGATE_BROKER: comma list)",
        },
    )
    listen: str = "127.0.0.1:8081"
    advertise: str = ""  # host:port clients should use when a request names no endpoints
    metrics_listen: str = ""
    export_dir: str = ""  # JSON-lines metric snapshots for the Spark job (docs/METRICS.md); empty = off
    export_interval_s: float = 10.0
    tls_cert: str = ""  # PEM certificate chain file; with tls_key: serve TLS instead of plaintext
    tls_key: str = ""  # PEM private key file
    receive_mode: str = field(
        default="adaptive",
        metadata={"help": f"one of {', '.join(RECEIVE_MODES)}, default adaptive (docs/RECEIVE.md)"},
    )
    # adaptive: longpoll when a group's receive rate (over the window) or its receives in progress per live broker
    # reach these; 0 switches a criterion off. Defaults from bench/realtime_bench.py, see docs/RECEIVE.md.
    adaptive_window_s: float = 1.0
    adaptive_rate_threshold: float = 0.0
    adaptive_concurrency_per_broker: float = 1.0
    # Proxies a group's consumers are spread over: the concurrency threshold is divided by it, so each proxy
    # judges the fleet-wide load from its own share (bench/sim, docs/SCALE.md). 1 = this proxy alone.
    adaptive_proxies: int = 1
    batch_receive: bool = field(
        default=True,
        metadata={
            "help": "serve popgate.ext.v1 ReceiveMessages (many messages per frame) beside v2; popgate's SDK falls"
            " back to v2 ReceiveMessage without it (docs/PROXY.md 'Batch receive')",
            "negate": "no-batch-receive",
        },
    )
    max_body_bytes: int = 4 * 1024 * 1024
    max_batch: int = 32
    queues_per_broker: int = 4
    min_invisible_s: float = 10.0
    max_invisible_s: float = 12 * 3600.0
    default_invisible_s: float = 60.0  # auto_renew / no invisible_duration (PushConsumer)
    # Consumer groups whose PushConsumers consume in order (Telemetry answers fifo=true: RocketMQ's orderly group).
    fifo_groups: tuple[str, ...] = field(
        default=(),
        metadata={
            "option": "fifo_group",
            "aliases": ("fifo_groups",),
            "help": "consumer group whose PushConsumers consume one message at a time, in order, repeated"
            " (env POPGATE_FIFO_GROUP: comma list); docs/PROXY.md 'FIFO messages'",
        },
    )
    # Renewal of auto_renew receives (docs/PROXY.md "auto_renew"): every default_invisible_s / 4, for at most
    # renew_max_s after the receive, at most this many handles per client id and in all (0 = no renewal).
    renew_max_s: float = 3 * 3600.0
    renew_max_per_client: int = 10_000
    renew_max_handles: int = 200_000
    min_long_polling_s: float = 0.0
    max_long_polling_s: float = 30.0
    default_long_polling_s: float = 20.0
    poll_reserve_s: float = 0.3
    max_delay_s: float = 24 * 3600.0
    broker_timeout_s: float = 3.0
    max_held_receives: int = 10_000  # receives in progress; more are TOO_MANY_REQUESTS
    max_answer_bytes: int = 256 * 1024 * 1024  # received messages not yet read by their clients; more: TOO_MANY
    # An answer its client does not read within this long (nor within its invisible time) gives its messages back
    # to their brokers; only the frame grpc is stuck writing stays counted in max_answer_bytes (docs/PROXY.md).
    max_answer_write_s: float = 30.0
    max_telemetry_streams: int = 10_000  # Telemetry streams open at once; more are TOO_MANY_REQUESTS
    max_send_bytes: int = 256 * 1024 * 1024  # bytes of sends in flight to brokers; more are TOO_MANY_REQUESTS
    send_chunk_bytes: int = 8 * 1024 * 1024  # encoded bytes per broker Send (below the broker's gRPC limit)
    health_interval_s: float = 1.0
    health_timeout_s: float = 0.5
    shutdown_grace_s: float = 5.0
    max_message_bytes: int = 64 * 1024 * 1024  # gRPC max receive size, > max_body_bytes
    log_level: str = "INFO"
    # Authentication (docs/PROXY.md "Authentication"): [[acl]] accounts from the config file; none = open.
    accounts: tuple[Account, ...] = field(
        default=(), metadata={"option": "acl", "file_only": True, "parse": accounts_from_config}
    )
    auth_skew_s: float = 300.0  # clock skew allowed around any time-zone offset of x-mq-date-time
    broker_token: str = ""  # shared secret sent to brokers started with the same --auth-token

    def __post_init__(self) -> None:
        if not self.brokers:
            raise SettingsError(
                "at least one --broker NAME=HOST:PORT is required (or POPGATE_BROKER=NAME=HOST:PORT,... in the "
                "environment: singular, as the flag; or brokers = [...] in the config file)"
            )
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
            ("renew_max_s", 0 < self.renew_max_s <= 7 * 24 * 3600, "0 < it <= 7 days"),
            ("renew_max_per_client", self.renew_max_per_client >= 0, ">= 0"),
            ("renew_max_handles", self.renew_max_handles >= 0, ">= 0 (0 = no renewal)"),
            ("poll_reserve_s", 0 <= self.poll_reserve_s < 5, "0..5"),
            ("max_delay_s", self.max_delay_s > 0, "> 0"),
            ("broker_timeout_s", self.broker_timeout_s > 0, "> 0"),
            ("max_held_receives", self.max_held_receives >= 1, ">= 1"),
            ("max_answer_bytes", self.max_answer_bytes >= 1024, ">= 1024"),
            ("max_answer_write_s", self.max_answer_write_s > 0, "> 0"),
            ("max_telemetry_streams", self.max_telemetry_streams >= 1, ">= 1"),
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
            ("export_dir", "://" not in self.export_dir, "a local directory, not a URI (docs/METRICS.md)"),
            ("log_level", self.log_level.upper() in _LOG_LEVELS, "one of " + ", ".join(_LOG_LEVELS)),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise SettingsError(f"{name}={getattr(self, name)!r} out of range: must be {rule}")


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the command line, the environment and the config file, validated."""
    parser = settings_parser(Settings, "popgate-proxy", description="popgate RocketMQ v2 gRPC proxy")
    return load_config(Settings, parser, argv, env, section="proxy")
