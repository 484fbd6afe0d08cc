"""A refused setting is named as the user gave it: flag, POPGATE_* variable or config file; in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import __main__ as broker_main
from proxy import __main__ as proxy_main
from proxy.settings import SettingsError, load

BROKER = ["--broker", "b1=127.0.0.1:1"]


def test_a_bad_value_is_named_by_the_flag_variable_or_file_it_came_from(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as flag:
        load([*BROKER, "--receive-mode", "bogus"], {})
    assert str(flag.value) == "--receive-mode 'bogus': choose one of adaptive, notify, longpoll"
    with pytest.raises(SettingsError) as variable:
        load(BROKER, {"POPGATE_RECEIVE_MODE": "bogus"})
    assert str(variable.value) == "POPGATE_RECEIVE_MODE 'bogus': choose one of adaptive, notify, longpoll"
    config = tmp_path / "proxy.toml"
    config.write_text('[proxy]\nreceive-mode = "bogus"\nmax_batch = 64\n')
    with pytest.raises(SettingsError) as file:
        load([*BROKER, "--receive-mode", "notify"], {"POPGATE_CONFIG": str(config)})
    assert str(file.value) == f"POPGATE_CONFIG {config}: max_batch=64 out of range: must be 1..32"
    with pytest.raises(SettingsError) as unreadable:
        load(BROKER, {"POPGATE_MAX_BATCH": "many"})
    assert str(unreadable.value) == "POPGATE_MAX_BATCH 'many': expected int"
    with pytest.raises(SettingsError) as listed:
        load([], {"POPGATE_BROKER": "b1=127.0.0.1:1,b2"})
    assert str(listed.value).startswith("POPGATE_BROKER 'b2': expected NAME=HOST:PORT")


def test_no_broker_names_the_proxys_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POPGATE_BROKERS", "b1=127.0.0.1:1")  # popgate stats' variable, not the proxy's
    assert proxy_main.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("popgate-proxy: at least one --broker NAME=HOST:PORT is required (or POPGATE_BROKER=")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("abc", "POPGATE_MAX_DELIVERY_ATTEMPTS 'abc': expected int"),
        ("0", "POPGATE_MAX_DELIVERY_ATTEMPTS must be in 1..2^31-1"),
    ],
)
def test_a_bad_broker_variable_is_one_line_not_the_usage(
    value: str, error: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("POPGATE_MAX_DELIVERY_ATTEMPTS", value)
    with pytest.raises(SystemExit) as exited:
        broker_main.main([])
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"popgate-broker: {error} (see popgate-broker --help)\n"


def test_a_negating_flag_has_a_variable_too() -> None:
    from broker.settings import parse as broker_settings

    assert broker_settings([], {"POPGATE_NO_AUTO_CREATE": "1"}).auto_create is False
    assert broker_settings([], {"POPGATE_NO_AUTO_CREATE": "false"}).auto_create is True
    assert broker_settings([], {"POPGATE_NO_AUTO_CREATE": "1", "POPGATE_AUTO_CREATE": "yes"}).auto_create is True
    assert broker_settings(["--auto-create"], {"POPGATE_NO_AUTO_CREATE": "1"}).auto_create is True
    with pytest.raises(SystemExit):  # one line naming the variable, exit status 2
        broker_settings([], {"POPGATE_NO_AUTO_CREATE": "maybe"})


def test_one_config_file_serves_both_programs_each_reading_its_own_table(tmp_path: Path) -> None:
    from broker.settings import parse as broker_settings

    both = tmp_path / "popgate.toml"
    both.write_text('[broker]\nqueues-per-topic = 2\n[proxy]\nreceive-mode = "notify"\n')
    assert broker_settings([], {"POPGATE_CONFIG": str(both)}).queues_per_topic == 2
    assert load(BROKER, {"POPGATE_CONFIG": str(both)}).receive_mode == "notify"
    proxy_only = tmp_path / "proxy.toml"  # what `POPGATE_CONFIG=proxy.toml popgate up` hands every child
    proxy_only.write_text('[proxy]\nreceive-mode = "longpoll"\n')
    assert broker_settings([], {"POPGATE_CONFIG": str(proxy_only)}).queues_per_topic == 4
    top_level = tmp_path / "broker.toml"  # a file without tables is still read from its top level
    top_level.write_text("queues-per-topic = 3\n")
    assert broker_settings([], {"POPGATE_CONFIG": str(top_level)}).queues_per_topic == 3


def test_top_level_keys_are_shared_beside_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file with both tables: its top-level keys serve both programs, checked as the tables' are, and a program's
    own table wins over them."""
    from broker.settings import parse as broker_settings

    shared = tmp_path / "popgate.toml"
    shared.write_text(
        'broker_token = "s3cret"\ntls-reload-s = "30s"\n'
        '[broker]\nname = "b1"\ntls_reload_s = 5\n[proxy]\nbrokers = ["b1=127.0.0.1:9001"]\n'
    )
    broker = broker_settings([], {"POPGATE_CONFIG": str(shared)})
    proxy = load([], {"POPGATE_CONFIG": str(shared)})
    assert (broker.broker_token, broker.tls_reload_s, broker.name) == ("s3cret", 5.0, "b1")
    assert (proxy.broker_token, proxy.tls_reload_s) == ("s3cret", 30.0)
    # The proxy's [[acl]] at the top level of a file both read: the broker leaves it to the proxy.
    shared.write_text(
        '[[acl]]\naccess_key = "ak"\nsecret_key = "sk-0123456789abcdef"\n'
        '[broker]\nname = "b1"\n[proxy]\nbrokers = ["b1=127.0.0.1:9001"]\n'
    )
    assert broker_settings([], {"POPGATE_CONFIG": str(shared)}).name == "b1"
    assert [a.access_key for a in load([], {"POPGATE_CONFIG": str(shared)}).accounts] == ["ak"]
    shared.write_text("no_such_setting = 1\n[proxy]\nbroker = []\n")  # no other program's table: refused
    with pytest.raises(SettingsError, match=r"unknown keys \['no_such_setting'\]"):
        load([], {"POPGATE_CONFIG": str(shared)})
    shared.write_text('tls_reload_s = "bogus"\n[broker]\nname = "b1"\n')
    with pytest.raises(SystemExit):
        broker_settings([], {"POPGATE_CONFIG": str(shared)})
    assert f"POPGATE_CONFIG {shared}: tls_reload_s 'bogus' is not" in capsys.readouterr().err


def test_a_config_file_that_is_not_utf8_is_named_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from broker.settings import parse as broker_settings

    config = tmp_path / "popgate.toml"
    config.write_bytes(b'listen = "127.0.0.1:0"\n\xff = 1\n')
    with pytest.raises(SettingsError) as proxy:
        load([*BROKER, "--config", str(config)], {})
    assert str(proxy.value) == f"--config {config}: not UTF-8 text (byte 23: 0xff)"
    with pytest.raises(SystemExit):
        broker_settings([], {"POPGATE_CONFIG": str(config)})
    assert f"POPGATE_CONFIG {config}: not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "environ", "named"),
    [([], {"POPGATE_DATA_DIR": ""}, "POPGATE_DATA_DIR"), (["--data-dir", " "], {}, "--data-dir")],
)
def test_an_empty_data_directory_is_refused(
    argv: list[str], environ: dict[str, str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not the working directory, where the store would go unnoticed."""
    from broker.settings import parse as broker_settings

    with pytest.raises(SystemExit):
        broker_settings(argv, environ)
    assert f"{named} must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("max_held = 1.9", "max_held 1.9: expected int"),
        ("queues_per_topic = true", "queues_per_topic True: expected int"),
        ("group_max_attempts = { billing = 2.5 }", "billing=2.5: expected GROUP=N, N a whole number"),
    ],
)
def test_a_whole_number_setting_takes_only_whole_numbers_from_the_file(
    line: str, error: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the flag and the variable do: not truncated to 1."""
    from broker.settings import parse as broker_settings

    config = tmp_path / "broker.toml"
    config.write_text(line + "\n")
    with pytest.raises(SystemExit):
        broker_settings(["--config", str(config)], {})
    assert error in capsys.readouterr().err
    with pytest.raises(SettingsError, match="expected float"):
        config.write_text("adaptive_rate_threshold = true\n")
        load([*BROKER, "--config", str(config)], {})
