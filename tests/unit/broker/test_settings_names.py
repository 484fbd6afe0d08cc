"""The broker's settings as an operator writes them: durations in seconds with units, old names refused with the
new one, the token under the proxy's name, log level and JSON logs, choices in --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from broker.settings import BrokerSettings
from broker.settings import parse as broker_settings
from popgate_process.config import settings_parser


def test_durations_are_seconds_with_units_and_the_broker_still_counts_in_ms() -> None:
    settings = broker_settings(
        ["--min-invisible-s", "250ms", "--max-invisible-s", "2h", "--max-poll-s", "300ms", "--max-delay-s", "1d"], {}
    )
    assert (settings.min_invisible_s, settings.max_invisible_s, settings.max_poll_s) == (0.25, 7200.0, 0.3)
    ms = (settings.min_invisible_ms, settings.max_invisible_ms, settings.max_poll_ms, settings.max_delay_ms)
    assert ms == (250, 7_200_000, 300, 86_400_000)
    defaults = BrokerSettings()  # the same as before they were seconds
    assert (defaults.min_invisible_ms, defaults.max_invisible_ms) == (100, 12 * 3600 * 1000)
    assert (defaults.max_poll_ms, defaults.max_delay_ms) == (30_000, 3 * 24 * 3600 * 1000)
    assert broker_settings([], {"POPGATE_MAX_POLL_S": "2"}).max_poll_ms == 2000


def test_a_range_error_names_the_seconds_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        broker_settings(["--min-invisible-s", "1m", "--max-invisible-s", "30s"], {})
    assert exited.value.code == 2
    assert "popgate-broker: --min-invisible-s must be >= 1 ms and <= max_invisible_s" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("min_invisible_ms", "min_invisible_s"),
        ("max_invisible_ms", "max_invisible_s"),
        ("max_poll_ms", "max_poll_s"),
        ("max_delay_ms", "max_delay_s"),
        ("auth_token", "broker_token"),
    ],
)
def test_an_old_name_is_refused_with_the_new_one_as_flag_variable_and_file_key(
    old: str, new: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flag, variable = "--" + old.replace("_", "-"), "POPGATE_" + old.upper()
    config = tmp_path / "broker.toml"
    config.write_text(f'[broker]\n{old} = "1"\n')
    for argv, environ, said in [
        ([flag, "1"], {}, f"{flag} is now --{new.replace('_', '-')}"),
        ([], {variable: "1"}, f"{variable} is now POPGATE_{new.upper()}"),
        (["--config", str(config)], {}, f"--config {config}: {old} is now {new}"),
    ]:
        with pytest.raises(SystemExit) as exited:
            broker_settings(argv, environ)
        assert exited.value.code == 2 and said in capsys.readouterr().err


def test_the_token_has_the_proxys_name() -> None:
    assert broker_settings(["--broker-token", "s3cret"], {}).broker_token == "s3cret"
    assert broker_settings([], {"POPGATE_BROKER_TOKEN": "s3cret"}).broker_token == "s3cret"


def test_help_shows_the_choices_and_durations_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    text = " ".join(settings_parser(BrokerSettings, "popgate-broker").format_help().split())
    for shown in [
        "--flush {sync,async}",
        "--consume-from {earliest,latest}",
        "--log-level {DEBUG,INFO,WARNING,ERROR,CRITICAL}",
        "--log-format {text,json} log lines as text or as one JSON object each (default: text)",
        "--min-invisible-s DURATION shortest Pop invisibility (default: 100ms)",
        "--max-poll-s DURATION longest long-polling time (a longer one is cut to this) (default: 30s)",
        "--max-delay-s DURATION longest delivery delay (default: 3d)",
    ]:
        assert shown in text, shown
    assert "-ms" not in text and "--auth-token" not in text


def test_a_log_format_or_level_outside_the_choices_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert broker_settings(["--log-level", "debug"], {}).log_level == "debug"
    for argv in (["--log-format", "xml"], ["--log-level", "loud"], ["--flush", "never"]):
        with pytest.raises(SystemExit) as exited:
            broker_settings(argv, {})
        assert exited.value.code == 2 and f"popgate-broker: {argv[0]} must be" in capsys.readouterr().err


def test_the_broker_logs_json_lines_with_log_format_json(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    argv = [sys.executable, "-m", "broker", "--data-dir", str(not_a_directory), "--listen", "127.0.0.1:0"]
    done = subprocess.run([*argv, "--log-format", "json"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    [entry] = [json.loads(line) for line in done.stderr.splitlines()]
    assert entry["level"] == "ERROR" and entry["logger"] == "broker"
    assert entry["message"].startswith(f"cannot start: --data-dir {not_a_directory}")
