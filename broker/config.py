"""Build a settings dataclass from flags, POPGATE_* environment variables and a TOML file.

Precedence: command-line flag > environment > config file (``--config`` or
POPGATE_CONFIG) > default. Every field ``foo_bar`` is flag ``--foo-bar``,
variable ``POPGATE_FOO_BAR`` and file key ``foo_bar`` (or ``foo-bar``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _convert(kind: Any, value: Any, name: str) -> Any:
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(value)
        if typing.get_origin(kind) is tuple:
            items = value if isinstance(value, list | tuple) else [v for v in str(value).split(",") if v.strip()]
            return tuple(str(v).strip() for v in items)
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"setting {name}: cannot read {value!r}") from None


def load_settings(
    cls: type[T], prog: str, argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> T:
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--config", help="TOML file of settings (also POPGATE_CONFIG)")
    for f in fields:
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if hints[f.name] is bool:
            parser.add_argument(flag, dest=f.name, action="store_true", default=None, help=help_text)
            negate = f.metadata.get("negate")
            if negate:
                parser.add_argument("--" + negate, dest=f.name, action="store_false", default=None)
        elif typing.get_origin(hints[f.name]) is tuple:
            parser.add_argument(flag, dest=f.name, action="append", default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, help=help_text)
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    config_path = args.config or environ.get("POPGATE_CONFIG")
    if config_path:
        with Path(config_path).open("rb") as fh:
            data = tomllib.load(fh)
        for key, value in data.items():
            values[key.replace("-", "_")] = value
    known = {f.name for f in fields}
    unknown = set(values) - known
    if unknown:
        parser.error(f"unknown setting(s) in {config_path}: {', '.join(sorted(unknown))}")
    for f in fields:
        env = environ.get("POPGATE_" + f.name.upper())
        if env is not None:
            values[f.name] = env
        flag_value = getattr(args, f.name)
        if flag_value is not None:
            values[f.name] = flag_value
    try:
        converted = {k: _convert(hints[k], v, k) for k, v in values.items()}
        return cls(**converted)
    except ValueError as exc:
        parser.error(str(exc))
