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
