"""Broker settings: one validated object fed by flags, POPGATE_* environment and a TOML file."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from popgate_contract import validation
from popgate_contract.errors import DomainError
from popgate_contract.session_client import MAX_WRITE_BYTES
from popgate_contract.validation import parse_host_port
from popgate_process.config import MIN_INTERVAL_S, load_settings
from popgate_process.logs import LOG_FORMATS, LOG_LEVELS

MAX_ATTEMPTS_LIMIT = 2**31 - 1  # an attempt count is an int32 in both protocols
MAX_GRPC_MESSAGE_LIMIT = 2**31 - 1  # grpc takes its message limits as an int32
MAX_QUEUES_PER_TOPIC = 256  # as a topic CreateTopic makes (broker/admin.py MAX_QUEUES)
FLUSH_MODES = ("sync", "async")
CONSUME_FROM = ("earliest", "latest")
# What a gRPC message holds beyond the bytes --max-pop-bytes, --max-body-bytes and a Session's joined write count: a
# Pop answer's one message past the budget carries its properties (<= 16 KiB), keys, tag, ids and receipt handle
# beside its body, and a Session frame wraps each answer (docs/BROKER.md, "Response size").
GRPC_MESSAGE_MARGIN = 64 * 1024


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part for part in value.replace(",", " ").split() if part)
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    raise ValueError(f"expected a list of names, got {value!r}")


def _group_attempts(value: object) -> tuple[tuple[str, int], ...]:
    """``GROUP=N`` items (repeated flags, a comma list, a TOML list) or a TOML table ``{GROUP = N}``."""
    items: list[tuple[str, Any]]
    if isinstance(value, dict):
        items = [(str(group), n) for group, n in value.items()]
    else:
        items = [item.partition("=")[::2] for item in _names(value)]
    pairs = []
    for group, n in items:
        try:
            if isinstance(n, bool | float):  # a TOML true or 1.9: not truncated to 1
                raise ValueError(n)
            pairs.append((group.strip(), int(n)))
        except (TypeError, ValueError):
            raise ValueError(f"{group}={n}: expected GROUP=N, N a whole number") from None
    return tuple(pairs)


@dataclass(frozen=True)
class BrokerSettings:
    name: str = field(default="b1", metadata={"help": "broker name (appears in receipt handles)"})
    listen: str = field(default="127.0.0.1:9001", metadata={"help": "gRPC HOST:PORT (port 0 = any free port)"})
    data_dir: Path = field(default=Path("./data/b1"), metadata={"help": "directory of the SQLite store"})
    metrics_listen: str = field(default="", metadata={"help": "HOST:PORT for Prometheus /metrics (empty = off)"})
    export_dir: str = field(default="", metadata={"help": "directory for JSON-lines metric snapshots (empty = off)"})
    export_interval_s: float = field(default=10.0, metadata={"help": "seconds between metric snapshots"})
    metrics_queue_offsets: bool = field(
        default=False,
        metadata={
            "help": "export the consumer and pull offsets per queue (a series per topic, group and queue); off,"
            " one per topic and group, summed over its queues (docs/METRICS.md)"
        },
    )
    flush: str = field(
        default="async",
        metadata={"help": "sync: fsync before acknowledging; async: WAL only", "choices": FLUSH_MODES},
    )
    queues_per_topic: int = field(default=4, metadata={"help": "queues of an auto-created topic"})
    auto_create: bool = field(
        default=False,
        metadata={
            "help": "create a topic on its first send (RocketMQ's autoCreateTopicEnable; `popgate up` turns it on);"
            " off, a send or receive of an unknown topic is TOPIC_NOT_FOUND and topics come from --topic or"
            " `popgate topic create`",
            "negate": "no-auto-create",
        },
    )
    topics: tuple[str, ...] = field(
        default=(),
        metadata={
            "option": "topic",
            "aliases": ("topics",),
            "parse": lambda value: _names(value),
            "help": "topic to create at start when missing, repeated (env POPGATE_TOPIC: comma list); "
            "without --auto-create these and those created by `popgate topic create` are the broker's topics",
        },
    )
    consume_from: str = field(
        default="earliest", metadata={"help": "where a new group starts", "choices": CONSUME_FROM}
    )
    max_delivery_attempts: int = field(default=17, metadata={"help": "deliveries before dead-lettering"})
    group_max_attempts: tuple[tuple[str, int], ...] = field(
        default=(),
        metadata={
            "parse": _group_attempts,
            "help": "GROUP=N: deliveries to consumer group GROUP before dead-lettering, instead of "
            "--max-delivery-attempts; repeated (env POPGATE_GROUP_MAX_ATTEMPTS: comma list; file: a table)",
        },
    )
    max_held: int = field(default=20000, metadata={"help": "held long polls before answering at once"})
    max_groups: int = field(
        default=10000, metadata={"help": "consumer group x topic states kept; a new one beyond is TOO_MANY_REQUESTS"}
    )
    max_topics: int = field(
        default=10000, metadata={"help": "topics kept; a Send that would create one beyond is TOO_MANY_REQUESTS"}
    )
    max_body_bytes: int = field(default=4 * 1024 * 1024, metadata={"help": "largest message body"})
    max_pop_batch: int = field(default=128, metadata={"help": "largest Pop batch (a larger one is served up to this)"})
    max_pop_bytes: int = field(
        default=8 * 1024 * 1024, metadata={"help": "largest Pop or ListMessages answer (bodies and overhead)"}
    )
    max_send_bytes: int = field(
        default=256 * 1024 * 1024,
        metadata={
            "help": "bytes of Sends in flight (bodies + 64 B each) until their commit; more is TOO_MANY_REQUESTS"
        },
    )
    max_pop_answer_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata={"help": "bytes of unary Pop answers not yet taken by their callers; more is TOO_MANY_REQUESTS"},
    )
    min_invisible_s: float = field(
        default=0.1, metadata={"help": "shortest Pop invisibility", "replaces": ("min_invisible_ms",)}
    )
    max_invisible_s: float = field(
        default=12 * 3600.0, metadata={"help": "longest invisibility", "replaces": ("max_invisible_ms",)}
    )
    max_poll_s: float = field(
        default=30.0,
        metadata={"help": "longest long-polling time (a longer one is cut to this)", "replaces": ("max_poll_ms",)},
    )
    max_delay_s: float = field(
        default=3 * 24 * 3600.0, metadata={"help": "longest delivery delay", "replaces": ("max_delay_ms",)}
    )
    schedule_max_in_flight: int = field(default=2000, metadata={"help": "scheduled messages delivered at once"})
    transaction_immunity_s: float = field(
        default=6.0, metadata={"help": "a half message's first check comes this long after its send (RocketMQ 6 s)"}
    )
    transaction_check_interval_s: float = field(
        default=30.0, metadata={"help": "time between two checks of a half message (RocketMQ 30 s)"}
    )
    transaction_max_checks: int = field(
        default=15, metadata={"help": "checks of a half message before it is rolled back (RocketMQ 15)"}
    )
    cache_bytes: int = field(default=64 * 1024 * 1024, metadata={"help": "payload cache size"})
    sweep_interval_s: float = field(default=1.0, metadata={"help": "safety sweep of held requests"})
    retention_s: float = field(
        default=72 * 3600.0,
        metadata={
            "help": "seconds a message is kept, consumed or not (RocketMQ's fileReservedTime, 72 h); 0 = for ever"
        },
    )
    retention_check_s: float = field(default=60.0, metadata={"help": "seconds between retention passes"})
    max_grpc_message_bytes: int = field(default=16 * 1024 * 1024, metadata={"help": "largest gRPC message"})
    shutdown_grace_s: float = field(default=5.0, metadata={"help": "time to finish RPCs on SIGTERM"})
    broker_token: str = field(
        default="",
        metadata={
            "help": "shared token proxies must send (x-popgate-token, their --broker-token); empty = open "
            "(proto/popgate_contract/broker_token.py)",
            "replaces": ("auth_token",),
        },
    )
    tls_cert: str = field(
        default="", metadata={"help": "PEM certificate chain file; with --tls-key: serve TLS instead of plaintext"}
    )
    tls_key: str = field(default="", metadata={"help": "PEM private key file of --tls-cert"})
    tls_reload_s: float = field(
        default=60.0,
        metadata={
            "help": "time between reads of --tls-cert and --tls-key: a renewed pair serves new connections (0 = never)"
        },
    )
    log_level: str = field(
        default="INFO", metadata={"help": "least severe log records written (any case)", "choices": LOG_LEVELS}
    )
    log_format: str = field(
        default="text", metadata={"help": "log lines as text or as one JSON object each", "choices": LOG_FORMATS}
    )

    def __post_init__(self) -> None:
        checks = [
            (self.flush in FLUSH_MODES, "flush must be sync or async"),
            (self.consume_from in CONSUME_FROM, "consume_from must be earliest or latest"),
            (self.log_level.upper() in LOG_LEVELS, "log_level must be one of " + ", ".join(LOG_LEVELS)),
            (self.log_format in LOG_FORMATS, "log_format must be text or json"),
            (
                1 <= self.queues_per_topic <= MAX_QUEUES_PER_TOPIC,
                f"queues_per_topic must be in 1..{MAX_QUEUES_PER_TOPIC}",
            ),
            (1 <= self.max_delivery_attempts <= MAX_ATTEMPTS_LIMIT, "max_delivery_attempts must be in 1..2^31-1"),
            (self.max_held >= 0, "max_held must be >= 0"),
            (self.max_groups >= 1, "max_groups must be >= 1"),
            (self.max_topics >= 1, "max_topics must be >= 1"),
            (
                0 < self.min_invisible_ms <= self.max_invisible_ms,
                "min_invisible_s must be >= 1 ms and <= max_invisible_s",
            ),
            (1 <= self.max_pop_batch <= 1024, "max_pop_batch must be in 1..1024"),
            (self.max_body_bytes >= 1, "max_body_bytes must be >= 1"),
            (self.max_poll_s >= 0, "max_poll_s must be >= 0"),
            (re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", self.name) is not None, "name must match [a-zA-Z0-9_-]{1,64}"),
            (self.max_pop_bytes >= 1, "max_pop_bytes must be >= 1"),
            (self.max_send_bytes >= 1024, "max_send_bytes must be >= 1024"),
            (self.max_pop_answer_bytes >= 1024, "max_pop_answer_bytes must be >= 1024"),
            (self.cache_bytes >= 0, "cache_bytes must be >= 0"),
            (self.schedule_max_in_flight >= 1, "schedule_max_in_flight must be >= 1"),
            (self.transaction_immunity_s >= 0, "transaction_immunity_s must be >= 0"),
            (self.transaction_check_interval_s > 0, "transaction_check_interval_s must be > 0"),
            (self.transaction_max_checks >= 1, "transaction_max_checks must be >= 1"),
            (self.max_delay_s >= 0, "max_delay_s must be >= 0"),
            (self.sweep_interval_s >= MIN_INTERVAL_S, f"sweep_interval_s must be >= {MIN_INTERVAL_S}"),
            (self.retention_s >= 0, "retention_s must be >= 0 (0 = keep for ever)"),
            (1 <= self.retention_check_s <= 86400, "retention_check_s must be in [1, 86400]"),
            (self.export_interval_s >= MIN_INTERVAL_S, f"export_interval_s must be >= {MIN_INTERVAL_S}"),
            (
                self.max_grpc_message_bytes <= MAX_GRPC_MESSAGE_LIMIT,
                f"max_grpc_message_bytes must be <= {MAX_GRPC_MESSAGE_LIMIT} (2 GiB - 1)",
            ),
            (
                self.max_grpc_message_bytes >= self.min_grpc_message_bytes,
                f"max_grpc_message_bytes must be >= {self.min_grpc_message_bytes} (the largest of max_pop_bytes, "
                f"max_body_bytes and a Session's {MAX_WRITE_BYTES} B write, plus {GRPC_MESSAGE_MARGIN} B)",
            ),
            (self.shutdown_grace_s >= 0, "shutdown_grace_s must be >= 0"),
            (
                self.tls_reload_s == 0 or self.tls_reload_s >= MIN_INTERVAL_S,
                f"tls_reload_s must be 0 (never) or >= {MIN_INTERVAL_S}",
            ),
            ("://" not in self.export_dir, "export_dir must be a local directory, not a URI (docs/METRICS.md)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        parse_host_port(self.listen, what="listen")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together: give both for TLS, neither for plaintext")
        for option in (self.tls_cert, self.tls_key):
            if option and not Path(option).is_file():
                raise ValueError(f"{option}: no such file (--tls-cert / --tls-key)")
        if self.metrics_listen:
            parse_host_port(self.metrics_listen, what="metrics_listen")
        for topic in self.topics:
            try:
                validation.check_topic(topic)  # a clear error at start, not at the first send
            except DomainError as exc:
                raise ValueError(f"--topic {topic!r}: {exc}") from None
        self._check_group_attempts()

    def _check_group_attempts(self) -> None:
        seen = set()
        for group, attempts in self.group_max_attempts:
            try:
                validation.check_group(group)
            except DomainError as exc:
                raise ValueError(f"--group-max-attempts {group}={attempts}: {exc}") from None
            if not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
                raise ValueError(f"--group-max-attempts {group}={attempts}: attempts must be in 1..2^31-1")
            if group in seen:
                raise ValueError(f"--group-max-attempts: consumer group {group} is given twice")
            seen.add(group)

    @property
    def min_grpc_message_bytes(self) -> int:
        """The smallest gRPC message limit every answer fits in: a Pop answer (up to --max-pop-bytes, or one message
        of up to --max-body-bytes alone) and a Session's joined write, each with GRPC_MESSAGE_MARGIN —
        tests/unit/test_settings_and_proto.py::test_the_grpc_message_limit_holds_every_answer."""
        return max(self.max_pop_bytes, self.max_body_bytes, MAX_WRITE_BYTES) + GRPC_MESSAGE_MARGIN

    # The broker's arithmetic is in whole milliseconds (the wire's units); the settings are seconds.
    @property
    def min_invisible_ms(self) -> int:
        return _ms(self.min_invisible_s)

    @property
    def max_invisible_ms(self) -> int:
        return _ms(self.max_invisible_s)

    @property
    def max_poll_ms(self) -> int:
        return _ms(self.max_poll_s)

    @property
    def max_delay_ms(self) -> int:
        return _ms(self.max_delay_s)

    @cached_property
    def _attempts_by_group(self) -> dict[str, int]:
        return dict(self.group_max_attempts)

    def max_attempts_of(self, group: str) -> int:
        """Deliveries of a message to `group` before it is dead-lettered: its --group-max-attempts, otherwise
        --max-delivery-attempts (RocketMQ: the subscription group's retryMaxTimes + 1)."""
        return self._attempts_by_group.get(group, self.max_delivery_attempts)


def parse(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> BrokerSettings:
    return load_settings(BrokerSettings, "popgate-broker", argv, environ, section="broker")
