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
