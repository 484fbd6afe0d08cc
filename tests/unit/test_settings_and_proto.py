import subprocess
import sys
from pathlib import Path

import pytest

from broker.settings import BrokerSettings, parse

ROOT = Path(__file__).resolve().parents[2]


def test_generated_protobuf_code_is_fresh() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_flag_beats_environment_beats_file(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('name = "from-file"\nqueues-per-topic = 8\nflush = "sync"\n')
    env = {"POPGATE_CONFIG": str(config), "POPGATE_NAME": "from-env", "POPGATE_AUTO_CREATE": "false"}
    settings = parse(["--name", "from-flag"], env)
    assert settings.name == "from-flag"
    assert settings.queues_per_topic == 8 and settings.flush == "sync"
    assert settings.auto_create is False
    assert parse([], {"POPGATE_NAME": "e"}).name == "e"
    assert parse(["--no-auto-create"], {}).auto_create is False


def test_invalid_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="flush"):
        BrokerSettings(flush="sometimes")
    with pytest.raises(SystemExit):
        parse(["--queues-per-topic", "many"], {})


@pytest.mark.parametrize(
    "setting",
    [
        {"sweep_interval_s": 0},  # a safety sweep on every loop turn: one core at 100 %
        {"max_pop_bytes": 0},
        {"cache_bytes": -5},
        {"shutdown_grace_s": -1},
        {"export_interval_s": 0},
        {"sweep_interval_s": 1e-9},  # shorter than 0.1 s: a busy core, and megabytes of snapshots a second
        {"export_interval_s": 0.01},
        {"tls_reload_s": 0.01},
        {"name": "b 1"},  # no proxy could name it in --broker NAME=HOST:PORT
        {"name": "b1\n"},
        {"listen": "127.0.0.1:70000"},  # would listen on port 4464 (70000 - 65536)
        {"metrics_listen": "127.0.0.1:65536"},
        {"max_grpc_message_bytes": 2**31},  # grpc's limit is an int32: OverflowError at start
        {"queues_per_topic": 257},  # CreateTopic's bound; 10^9 queues: MemoryError at start
    ],
    ids=lambda setting: next(iter(setting)),
)
def test_settings_out_of_range_are_refused(setting: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(setting))):
        BrokerSettings(**setting)  # type: ignore[arg-type]


def test_the_grpc_message_limit_holds_every_answer(capsys: pytest.CaptureFixture[str]) -> None:
    """A limit below an answer the broker would send (a Pop of --max-pop-bytes, one message of --max-body-bytes, a
    Session's 1 MiB joined write) is refused at start: each such answer would fail the caller's stream."""
    with pytest.raises(SystemExit):
        parse(["--max-grpc-message-bytes", "64KiB"], {})
    assert "--max-grpc-message-bytes must be >= 8454144" in capsys.readouterr().err  # 8 MiB + 64 KiB

    def small(limit: int) -> BrokerSettings:
        return BrokerSettings(max_grpc_message_bytes=limit, max_pop_bytes=256 * 1024, max_body_bytes=256 * 1024)

    with pytest.raises(ValueError, match="max_grpc_message_bytes must be >= 1114112"):  # 1 MiB write + 64 KiB
        small(1024 * 1024)
    with pytest.raises(ValueError, match="max_grpc_message_bytes"):
        BrokerSettings(max_grpc_message_bytes=8 * 1024 * 1024, max_body_bytes=8 * 1024 * 1024)
    assert small(1088 * 1024).max_grpc_message_bytes == 1088 * 1024
    assert BrokerSettings().max_grpc_message_bytes == 16 * 1024 * 1024


def test_group_max_attempts_from_flags_environment_and_file(tmp_path: Path) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('max-delivery-attempts = 5\n[group-max-attempts]\norders = 3\n"tenant%billing" = 9\n')
    from_file = parse([], {"POPGATE_CONFIG": str(config)})
    assert [from_file.max_attempts_of(g) for g in ("orders", "tenant%billing", "billing")] == [3, 9, 5]
    listed = tmp_path / "listed.toml"
    listed.write_text('group_max_attempts = ["orders=4"]\n')
    assert parse([], {"POPGATE_CONFIG": str(listed)}).group_max_attempts == (("orders", 4),)
    from_env = parse([], {"POPGATE_GROUP_MAX_ATTEMPTS": "orders=2, audit=1"})
    assert from_env.group_max_attempts == (("orders", 2), ("audit", 1))
    from_flags = parse(["--group-max-attempts", "orders=6", "--group-max-attempts", "audit=7"], {})
    assert [from_flags.max_attempts_of(g) for g in ("orders", "audit", "other")] == [6, 7, 17]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("orders", "expected GROUP=N"),
        ("orders=many", "expected GROUP=N"),
        ("orders=0", "attempts must be in 1..2"),
        ("bad!=3", "consumer group name"),
        ("orders=2,orders=3", "orders is given twice"),
    ],
)
def test_bad_group_max_attempts_are_refused_by_name(value: str, error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse([], {"POPGATE_GROUP_MAX_ATTEMPTS": value})
    assert error in capsys.readouterr().err


def test_an_auto_created_topic_has_at_most_the_queues_create_topic_allows() -> None:
    from broker.admin import MAX_QUEUES

    assert BrokerSettings(queues_per_topic=MAX_QUEUES).queues_per_topic == MAX_QUEUES
    with pytest.raises(ValueError, match=f"queues_per_topic must be in 1..{MAX_QUEUES}"):
        BrokerSettings(queues_per_topic=MAX_QUEUES + 1)
