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
        {"max_send_batch": 0},
        {"max_pop_bytes": 0},
        {"cache_bytes": -5},
        {"shutdown_grace_s": -1},
        {"export_interval_s": 0},
        {"name": "b 1"},  # no proxy could name it in --broker NAME=HOST:PORT
        {"name": "b1\n"},
    ],
    ids=lambda setting: next(iter(setting)),
)
def test_settings_out_of_range_are_refused(setting: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(setting))):
        BrokerSettings(**setting)  # type: ignore[arg-type]
