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
from popgate_process.config import MIN_INTERVAL_S, settings_parser
from popgate_process.config import SettingsError as SettingsError
from popgate_process.config import load as load_config
from popgate_process.logs import LOG_FORMATS, LOG_LEVELS
from proxy.auth import Account, accounts_from_config

RECEIVE_MODES = ("adaptive", "notify", "longpoll")
SERVERS = ("h2", "grpcio")
AUTH_MODES = ("auto", "required")
BROKER_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MAX_MESSAGE_LIMIT = 2**31 - 1  # grpc and the h2 server take a message limit as an int32


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    name: str
    target: str  # host:port; host may be a DNS name
    host_name: str = ""  # the name TLS verifies in the broker's certificate, when not the target's host

    @classmethod
    def parse(cls, text: str) -> BrokerAddress:
        name, sep, target = text.strip().partition("=")
        if not sep or not BROKER_NAME.fullmatch(name):
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


def _setting(text: str, *, default: Any, **metadata: Any) -> Any:
    """A field with its --help words (popgate_process.config adds its default, in its units) and more metadata."""
    return field(default=default, metadata={"help": text, **metadata})


@dataclass(frozen=True, slots=True)
class Settings:
    brokers: tuple[BrokerAddress, ...] = field(
        default=(),
        metadata={
            "option": "broker",
            "aliases": ("brokers",),
            "parse": _brokers,
            "help": "NAME=HOST:PORT, repeated (env POPGATE_BROKER: comma list); or --broker-srv",
        },
    )
    broker_srv: str = _setting(
        "DNS SRV name listing the brokers (a headless Service: _grpc._tcp.popgate-broker), followed as brokers "
        "come and go; instead of --broker",
        default="",
    )
    broker_dns_server: str = _setting("HOST:PORT of the DNS server for --broker-srv (empty = the system's)", default="")
    broker_dns_interval_s: float = _setting("time between lookups of --broker-srv", default=5.0)
    broker_forget_s: float = _setting("a broker missing from --broker-srv this long is dropped", default=300.0)
    broker_tls_ca: str = _setting(
        "PEM CA bundle: reach brokers over TLS, verified against it (empty = plaintext)", default=""
    )
    listen: str = _setting("gRPC HOST:PORT clients connect to (port 0 = any free port)", default="127.0.0.1:8081")
    advertise: str = _setting(
        "HOST:PORT routes name when a request names no endpoints (default: the bound one)", default=""
    )
    metrics_listen: str = _setting("HOST:PORT for Prometheus /metrics (empty = off)", default="")
    export_dir: str = _setting(
        "directory of JSON-lines metric snapshots for the Spark job (docs/METRICS.md)", default=""
    )
    export_interval_s: float = _setting("time between metric snapshots", default=10.0)
    tls_cert: str = _setting("PEM certificate chain file; with --tls-key: serve TLS instead of plaintext", default="")
    tls_key: str = _setting("PEM private key file of --tls-cert", default="")
    tls_reload_s: float = _setting(
        "time between reads of --tls-cert and --tls-key: a renewed pair serves new connections (0 = never)",
        default=60.0,
    )
    server: str = _setting(
        "the clients' gRPC server: h2 (popgate's, a receive's messages in one write) or grpcio (grpc's own);"
        " docs/PROXY.md 'Server'",
        default="h2",
        choices=SERVERS,
    )
    receive_mode: str = _setting("how a receive waits (docs/RECEIVE.md)", default="adaptive", choices=RECEIVE_MODES)
    # adaptive: longpoll when a group's receive rate (over the window) or its receives in progress per live broker
    # reach these; 0 switches a criterion off. Defaults from bench/realtime_bench.py, see docs/RECEIVE.md.
    adaptive_window_s: float = _setting("adaptive: window of a group's receive rate", default=1.0)
    adaptive_rate_threshold: float = _setting(
        "adaptive: long-poll at this many receives/s of a group (0 = off)", default=0.0
    )
    adaptive_concurrency_per_broker: float = _setting(
        "adaptive: long-poll at this many receives of a group in progress per live broker (0 = off)", default=1.0
    )
    # Proxies a group's consumers are spread over: the concurrency threshold is divided by it, so each proxy
    # judges the fleet-wide load from its own share (bench/sim, docs/SCALE.md). 1 = this proxy alone.
    adaptive_proxies: int = _setting("adaptive: proxies a group's consumers are spread over", default=1)
    batch_receive: bool = field(
        default=True,
        metadata={
            "help": "serve popgate.ext.v1 ReceiveMessages (many messages per frame) beside v2; popgate's SDK falls"
            " back to v2 ReceiveMessage without it (docs/PROXY.md 'Batch receive')",
            "negate": "no-batch-receive",
        },
    )
    max_body_bytes: int = _setting("largest message body (MESSAGE_BODY_TOO_LARGE)", default=4 * 1024 * 1024)
    max_batch: int = _setting("largest receive batch_size (1..32)", default=32)
    queues_per_broker: int = _setting("queues per broker listed in routes", default=4)
    min_invisible_s: float = _setting("shortest invisible time a receive may ask", default=10.0)
    max_invisible_s: float = _setting("longest invisible time a receive may ask", default=12 * 3600.0)
    default_invisible_s: float = _setting(
        "invisible time of auto_renew receives and of those that ask none (PushConsumer)", default=60.0
    )
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
    renew_max_s: float = _setting("auto_renew: no renewal after this long since the receive", default=3 * 3600.0)
    renew_max_per_client: int = _setting("auto_renew: handles renewed per client id", default=10_000)
    renew_max_handles: int = _setting("auto_renew: handles renewed in all (0 = no renewal)", default=200_000)
    min_long_polling_s: float = _setting("shortest long-polling time (a client's is clamped)", default=0.0)
    max_long_polling_s: float = _setting("longest long-polling time (a client's is clamped)", default=30.0)
    default_long_polling_s: float = _setting("long-polling time of a request that asks none", default=20.0)
    poll_reserve_s: float = _setting("how much earlier than the client's deadline a receive is answered", default=0.3)
    max_delay_s: float = _setting("longest delivery delay (ILLEGAL_DELIVERY_TIME beyond)", default=24 * 3600.0)
    broker_timeout_s: float = _setting("deadline of unary broker calls (a Pop: its poll time and this)", default=3.0)
    max_held_receives: int = _setting("receives in progress; more are TOO_MANY_REQUESTS", default=10_000)
    max_answer_bytes: int = _setting(
        "received messages not yet read by their clients; more are TOO_MANY_REQUESTS", default=256 * 1024 * 1024
    )
    # An answer its client does not read within this long (nor within its invisible time) gives its messages back
    # to their brokers; only the frame grpc is stuck writing stays counted in max_answer_bytes (docs/PROXY.md).
    max_answer_write_s: float = _setting("an answer not read within this long gives its messages back", default=30.0)
    max_telemetry_streams: int = _setting("Telemetry streams open at once; more are TOO_MANY_REQUESTS", default=10_000)
    max_send_bytes: int = _setting(
        "bytes of sends in flight to brokers; more are TOO_MANY_REQUESTS", default=256 * 1024 * 1024
    )
    send_chunk_bytes: int = _setting(
        "encoded bytes per broker Send (below the broker's gRPC limit)", default=8 * 1024 * 1024
    )
    health_interval_s: float = _setting("time between health checks of every broker", default=1.0)
    health_timeout_s: float = _setting("deadline of a broker health check", default=0.5)
    shutdown_grace_s: float = _setting("time in-flight RPCs get on SIGTERM", default=5.0)
    # A client connection this old is told to reconnect (GOAWAY), so that clients spread over proxies added later
    # (docs/PROXY.md "Server").
    max_connection_age_s: float = _setting(
        "client connections older than this are asked to reconnect (0 = never)", default=0.0
    )
    max_connection_age_grace_s: float = _setting(
        "calls running on a connection asked to reconnect may end within this long", default=60.0
    )
    max_message_bytes: int = _setting("gRPC max receive size, > max_body_bytes", default=64 * 1024 * 1024)
    log_level: str = _setting("least severe log records written (any case)", default="INFO", choices=LOG_LEVELS)
    log_format: str = _setting("log lines as text or as one JSON object each", default="text", choices=LOG_FORMATS)
    # Authentication (docs/PROXY.md "Authentication"): [[acl]] accounts from the config file; none = open, unless
    # auth is "required".
    accounts: tuple[Account, ...] = field(
        default=(), metadata={"option": "acl", "file_only": True, "parse": accounts_from_config}
    )
    auth: str = _setting(
        "auto: accounts given = on, none = open (logged at start); required: refuse to start without accounts",
        default="auto",
        choices=AUTH_MODES,
    )
    auth_skew_s: float = _setting("clock skew allowed around any time-zone offset of x-mq-date-time", default=300.0)
    broker_token: str = _setting("shared secret sent to brokers started with the same --broker-token", default="")

    def __post_init__(self) -> None:
        if not self.brokers and not self.broker_srv:
            raise SettingsError(
                "at least one --broker NAME=HOST:PORT is required (or POPGATE_BROKER=NAME=HOST:PORT,... in the "
                "environment: singular, as the flag; or brokers = [...] in the config file), or --broker-srv NAME"
            )
        if self.brokers and self.broker_srv:
            raise SettingsError("--broker and --broker-srv exclude each other: list the brokers or name them in DNS")
        if self.broker_dns_server:
            parse_host_port(self.broker_dns_server, what="--broker-dns-server")
        if self.broker_tls_ca and not Path(self.broker_tls_ca).is_file():
            raise SettingsError(f"--broker-tls-ca {self.broker_tls_ca}: no such file")
        names = [b.name for b in self.brokers]
        if len(set(names)) != len(names):
            raise SettingsError(f"--broker names must be unique, got {names}")
        parse_host_port(self.listen, what="--listen")
        for name in ("advertise", "metrics_listen"):
            if getattr(self, name):
                parse_host_port(getattr(self, name), what=f"--{name.replace('_', '-')}")
        if self.receive_mode not in RECEIVE_MODES:
            raise SettingsError(f"--receive-mode {self.receive_mode!r}: choose one of {', '.join(RECEIVE_MODES)}")
        if self.server not in SERVERS:
            raise SettingsError(f"--server {self.server!r}: choose one of {', '.join(SERVERS)}")
        if self.auth not in AUTH_MODES:
            raise SettingsError(f"--auth {self.auth!r}: choose one of {', '.join(AUTH_MODES)}")
        if self.auth == "required" and not self.accounts:
            # tests/unit/proxy/test_auth.py::test_a_proxy_that_requires_authentication_refuses_to_start_without_accounts
            raise SettingsError("--auth required: no [[acl]] accounts in the config file (--config / POPGATE_CONFIG)")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError("--tls-cert and --tls-key go together: give both for TLS, neither for plaintext")
        for name in ("tls_cert", "tls_key"):
            if getattr(self, name) and not Path(getattr(self, name)).is_file():
                raise SettingsError(f"--{name.replace('_', '-')} {getattr(self, name)}: no such file")
        self._check_ranges()

    def _check_ranges(self) -> None:
        checks = [
            ("max_body_bytes", 1 <= self.max_body_bytes < self.max_message_bytes, "1 <= it < max_message_bytes"),
            ("max_message_bytes", self.max_message_bytes <= MAX_MESSAGE_LIMIT, f"<= {MAX_MESSAGE_LIMIT} (2 GiB - 1)"),
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
            ("health_interval_s", self.health_interval_s >= MIN_INTERVAL_S, f">= {MIN_INTERVAL_S}"),
            ("broker_dns_interval_s", self.broker_dns_interval_s >= MIN_INTERVAL_S, f">= {MIN_INTERVAL_S}"),
            ("broker_forget_s", self.broker_forget_s >= 0, ">= 0"),
            ("health_timeout_s", 0 < self.health_timeout_s, "> 0"),
            ("shutdown_grace_s", self.shutdown_grace_s >= 0, ">= 0"),
            ("max_connection_age_s", self.max_connection_age_s >= 0, ">= 0 (0 = never)"),
            ("max_connection_age_grace_s", self.max_connection_age_grace_s >= 0, ">= 0"),
            (
                "tls_reload_s",
                self.tls_reload_s == 0 or self.tls_reload_s >= MIN_INTERVAL_S,
                f"0 (never) or >= {MIN_INTERVAL_S}",
            ),
            ("export_interval_s", self.export_interval_s >= MIN_INTERVAL_S, f">= {MIN_INTERVAL_S}"),
            ("auth_skew_s", 0 < self.auth_skew_s <= 3600, "0 < it <= 3600"),
            ("adaptive_window_s", 0 < self.adaptive_window_s <= 3600, "0 < it <= 3600"),
            ("adaptive_rate_threshold", self.adaptive_rate_threshold >= 0, ">= 0 (0 = criterion off)"),
            ("adaptive_concurrency_per_broker", self.adaptive_concurrency_per_broker >= 0, ">= 0 (0 = criterion off)"),
            ("adaptive_proxies", self.adaptive_proxies >= 1, ">= 1"),
            ("export_dir", "://" not in self.export_dir, "a local directory, not a URI (docs/METRICS.md)"),
            ("log_level", self.log_level.upper() in LOG_LEVELS, "one of " + ", ".join(LOG_LEVELS)),
            ("log_format", self.log_format in LOG_FORMATS, "one of " + ", ".join(LOG_FORMATS)),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise SettingsError(f"{name}={getattr(self, name)!r} out of range: must be {rule}")


def load(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Settings from the command line, the environment and the config file, validated."""
    parser = settings_parser(Settings, "popgate-proxy", description="popgate RocketMQ v2 gRPC proxy")
    return load_config(Settings, parser, argv, env, section="proxy")
