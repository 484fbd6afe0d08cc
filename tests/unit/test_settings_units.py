"""Durations and sizes with units in the servers' settings, --help with defaults and choices, --version, JSON logs."""

from __future__ import annotations

import io
import json
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from broker.settings import BrokerSettings
from broker.settings import parse as broker_settings
from popgate_process.config import load as load_config
from popgate_process.config import settings_parser
from popgate_process.logs import JsonLogFormatter, configure_logging
from popgate_process.units import format_duration, format_size, parse_duration, parse_size
from proxy import __main__ as proxy_main
from proxy.settings import Settings, SettingsError, load

BROKER = ["--broker", "b1=127.0.0.1:1"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("2.5", 2.5),
        ("30", 30.0),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("2m", 120.0),
        ("1h30m", 5400.0),
        ("7d", 604800.0),
        (".5s", 0.5),
        (" 10s ", 10.0),
        (3, 3.0),  # a TOML number: seconds
        (0.25, 0.25),
    ],
)
def test_a_duration_is_seconds_or_a_number_with_units(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5x", "5 minutes", "ms", "1h 30m", "", "nan", "inf", "--1", True])
def test_a_duration_that_is_none_is_refused_naming_the_forms_taken(text: object) -> None:
    with pytest.raises(ValueError, match="not a duration|not a finite duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("4KiB", 4096), ("64MiB", 64 << 20), ("1.5GiB", 3 << 29), ("4 kib", 4096), ("100B", 100), (7, 7)],
)
def test_a_size_is_bytes_or_a_number_with_a_1024_based_unit(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "instead"), [("64MB", "64MiB"), ("4k", "4KiB"), ("1G", "1GiB"), ("2tb", "2TiB")])
def test_an_ambiguous_size_unit_is_refused_with_the_1024_based_one_to_write(text: str, instead: str) -> None:
    with pytest.raises(ValueError, match=f"sizes are 1024-based, write {instead}"):
        parse_size(text)


@pytest.mark.parametrize("text", ["x", "-1", "1.3B", "4 MiBs", "", "0.5KiBB"])
def test_a_size_that_is_none_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a size|not a whole number of bytes"):
        parse_size(text)


@pytest.mark.parametrize("seconds", [43200.0, 300.0, 10.0, 0.3, 2.5, 0.0, 5400.0, 604800.0])
def test_a_shown_duration_reads_back_as_itself(seconds: float) -> None:
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize("size", [4 << 20, 256 << 20, 1000, 0, 1024, 3 << 29])
def test_a_shown_size_reads_back_as_itself(size: int) -> None:
    assert parse_size(format_size(size)) == size


def test_the_proxys_durations_and_sizes_take_units_from_flags_variables_and_the_file(tmp_path: Path) -> None:
    settings = load([*BROKER, "--max-body-bytes", "1MiB", "--broker-timeout-s", "1500ms"], {})
    assert (settings.max_body_bytes, settings.broker_timeout_s) == (1 << 20, 1.5)
    settings = load(BROKER, {"POPGATE_MAX_INVISIBLE_S": "2h", "POPGATE_SEND_CHUNK_BYTES": "16MiB"})
    assert (settings.max_invisible_s, settings.send_chunk_bytes) == (7200.0, 16 << 20)
    config = tmp_path / "proxy.toml"
    config.write_text('[proxy]\nmax_answer_bytes = "64MiB"\nhealth_interval_s = "250ms"\nmax_delay_s = 60\n')
    settings = load(BROKER, {"POPGATE_CONFIG": str(config)})
    assert (settings.max_answer_bytes, settings.health_interval_s, settings.max_delay_s) == (64 << 20, 0.25, 60.0)
    assert load([*BROKER, "--max-body-bytes", "4194304"], {}).max_body_bytes == 4 << 20  # plain bytes still


def test_a_bad_unit_is_named_by_the_flag_or_variable_it_came_from() -> None:
    with pytest.raises(SettingsError) as flag:
        load([*BROKER, "--max-body-bytes", "4MB"], {})
    assert str(flag.value) == "--max-body-bytes '4MB': sizes are 1024-based, write 4MiB (or the bytes)"
    with pytest.raises(SettingsError) as variable:
        load(BROKER, {"POPGATE_SHUTDOWN_GRACE_S": "5 sec"})
    assert str(variable.value).startswith("POPGATE_SHUTDOWN_GRACE_S '5 sec' is not a duration: give seconds")


def test_the_brokers_durations_and_sizes_take_units_too() -> None:
    """The broker shares the loader: its *_s and *_bytes settings read units the same way."""
    settings = broker_settings(["--retention-s", "3d", "--max-body-bytes", "8MiB"], {})
    assert (settings.retention_s, settings.max_body_bytes) == (3 * 86400.0, 8 << 20)


def _help(monkeypatch: pytest.MonkeyPatch, cls: type, prog: str) -> str:
    monkeypatch.setenv("COLUMNS", "300")
    return " ".join(settings_parser(cls, prog).format_help().split())


def test_help_shows_every_default_in_its_units_and_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _help(monkeypatch, Settings, "popgate-proxy")
    for shown in [
        "--max-body-bytes SIZE largest message body (MESSAGE_BODY_TOO_LARGE) (default: 4MiB)",
        "--max-invisible-s DURATION longest invisible time a receive may ask (default: 12h)",
        "--poll-reserve-s DURATION how much earlier than the client's deadline a receive is answered (default: 300ms)",
        "--receive-mode {adaptive,notify,longpoll}",
        "--log-level {DEBUG,INFO,WARNING,ERROR,CRITICAL}",
        "--log-format {text,json} log lines as text or as one JSON object each (default: text)",
        "(default: on)",  # --batch-receive
        "Durations: seconds (2.5) or with a unit: 500ms",
    ]:
        assert shown in text, shown
    assert "(default: )" not in text  # no empty default (a path, a list, a secret)
    broker = _help(monkeypatch, BrokerSettings, "popgate-broker")
    assert "--retention-check-s DURATION seconds between retention passes (default: 1m)" in broker
    assert "--max-pop-bytes SIZE largest Pop or ListMessages answer (bodies and overhead) (default: 8MiB)" in broker
    assert "--queues-per-topic QUEUES_PER_TOPIC queues of an auto-created topic (default: 4)" in broker


def test_both_servers_print_their_version(capsys: pytest.CaptureFixture[str]) -> None:
    for prog, run in [
        ("popgate-proxy", lambda: load(["--version"], {})),
        ("popgate-broker", lambda: broker_settings(["--version"], {})),
    ]:
        with pytest.raises(SystemExit) as exited:
            run()
        assert exited.value.code == 0
        out = capsys.readouterr().out.split()
        assert out[0] == prog and out[1][0].isdigit(), out


def test_the_log_format_is_text_or_json() -> None:
    assert load([*BROKER, "--log-format", "json", "--log-level", "debug"], {}).log_format == "json"
    with pytest.raises(SettingsError, match=r"^--log-format='xml' out of range: must be one of text, json"):
        load([*BROKER, "--log-format", "xml"], {})


def test_a_json_log_line_is_one_object_with_time_level_logger_message_and_exception() -> None:
    record = logging.LogRecord("proxy.core", logging.WARNING, __file__, 1, "broker %s down\nfor now", ("b1",), None)
    entry = json.loads(JsonLogFormatter().format(record))
    assert entry["level"] == "WARNING" and entry["logger"] == "proxy.core"
    assert entry["message"] == "broker b1 down\nfor now" and entry["time"].endswith("Z")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = logging.LogRecord("proxy", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = JsonLogFormatter().format(failed)
    assert "\n" not in line and "RuntimeError: boom" in json.loads(line)["exception"]


def test_the_proxy_configures_json_logs_on_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("info", "json", stream)
        logging.getLogger("proxy.test").info("hello %s", "world")
        logging.getLogger("proxy.test").debug("not at info")
        [line] = stream.getvalue().splitlines()
        assert json.loads(line)["message"] == "hello world"
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert proxy_main.configure_logging is configure_logging  # what the entry point calls with --log-format


@dataclass(frozen=True)
class _Renamed:
    broker_token: str = field(default="", metadata={"replaces": ("auth_token",)})
    poll_s: float = field(default=1.0, metadata={"replaces": ("poll_ms",)})


def test_an_old_name_of_a_setting_is_refused_with_the_new_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = settings_parser(_Renamed, "prog")
    with pytest.raises(SystemExit) as exited:
        load_config(_Renamed, parser, ["--poll-ms", "500"], {})
    assert exited.value.code == 2 and "prog: error: --poll-ms is now --poll-s" in capsys.readouterr().err
    with pytest.raises(SettingsError, match="^POPGATE_AUTH_TOKEN is now POPGATE_BROKER_TOKEN$"):
        load_config(_Renamed, parser, [], {"POPGATE_AUTH_TOKEN": "s3cret"})
    config = tmp_path / "old.toml"
    config.write_text('auth-token = "s3cret"\n')
    with pytest.raises(SettingsError, match=f"^--config {config}: auth_token is now broker_token$"):
        load_config(_Renamed, parser, ["--config", str(config)], {})
    assert "--auth-token" not in parser.format_help()
    assert load_config(_Renamed, parser, ["--poll-s", "250ms"], {}).poll_s == 0.25
