"""Build a settings dataclass from flags, POPGATE_* environment variables and a TOML file.

One loader for both programs (`broker.settings`, `proxy.settings`): the dataclass
lists every option once, and the command line, the environment and the file are all
read through it; the dataclass validates the result when it is constructed.

Precedence: command-line flag > environment > config file (``--config`` or
POPGATE_CONFIG) > default. Every field ``foo_bar`` is flag ``--foo-bar``,
variable ``POPGATE_FOO_BAR`` and file key ``foo_bar`` (or ``foo-bar``), read as its
type. A field's metadata may refine that:

- ``help``: the flag's help (otherwise "<type>, default <value>");
- ``negate``: for a bool, a flag that sets it false (``no-auto-create``), and its variable
  (``POPGATE_NO_AUTO_CREATE=1``; the field's own variable wins when both are set);
- ``option``: the flag, variable and file key when not the field's name (``broker``);
- ``aliases``: more file keys for it; the first one present wins over ``option``;
- ``parse``: a function reading the raw value (a string, a list of repeated flags or a TOML value);
- ``file_only``: no flag nor variable; with a `section`, the key may also sit at the top level,
  beside the section's table, and wins there (``[[acl]]``).

An error about a setting starts with its flag or field name (``--receive-mode 'x': ...``,
``max_held must be >= 0``); the loader puts where the value came from in its place: the flag,
the variable (``POPGATE_RECEIVE_MODE 'x': ...``) or the file (``--config b.toml: max_held must ...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
import tomllib
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from popgate_contract.validation import parse_host_port

T = TypeVar("T")
PROGRAM_SECTIONS = frozenset(("broker", "proxy"))  # one file may hold a table for each program


class SettingsError(ValueError):
    """A setting is missing, unreadable or out of range; the message names it."""


def cannot_listen(address: str) -> str | None:
    """Why a server could not listen on `address` (HOST:PORT, port not 0), in the system's words ("Address
    already in use"), or None when it can. grpc's own failure says only "Failed to bind ... set
    GRPC_VERBOSITY=debug", after a raw log line of its own: asked first, the cause is told in one line."""
    host, port = parse_host_port(address, what="address")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"{host}: {exc.strerror}"
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc binds: a TIME_WAIT port is free
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _fields(cls: type[Any]) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _option(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata.get("option", f.name))


def _type_name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def _convert(kind: Any, value: Any) -> Any:
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


def settings_parser(cls: type[Any], prog: str, *, description: str | None = None) -> argparse.ArgumentParser:
    """The command line of `cls`: ``--config`` and a flag per field that is not ``file_only``."""
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--config", help="TOML file of settings, keys as the long flags with '-' or '_' (POPGATE_CONFIG)"
    )
    for f in _fields(cls):
        if f.metadata.get("file_only"):
            continue
        flag = "--" + _option(f).replace("_", "-")
        kind = hints[f.name]
        help_text = f.metadata.get("help") or f"{_type_name(kind)}, default {f.default!r}"
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action="store_true", default=None, help=help_text)
            negate = f.metadata.get("negate")
            if negate:
                variable = "POPGATE_" + negate.upper().replace("-", "_")
                parser.add_argument(
                    "--" + negate, dest=f.name, action="store_false", default=None, help=f"the opposite ({variable})"
                )
        else:
            action = "append" if typing.get_origin(kind) is tuple else "store"
            metavar = _option(f).upper()
            parser.add_argument(flag, dest=f.name, action=action, default=None, metavar=metavar, help=help_text)
    return parser


def read_config(cls: type[Any], path: Path, *, section: str | None = None, where: str = "") -> dict[str, Any]:
    """The file's settings by field name; unknown keys are an error, which starts with `where`
    (how the file was given, by default ``--config PATH``).

    With a `section`, the settings are the ``[section]`` table when the file has one,
    otherwise its top level but for the other programs' tables (`PROGRAM_SECTIONS`).
    """
    where = where or f"--config {path}"
    try:
        document = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{where}: {exc}") from None
    # The section's table when there is one (not the proxy's own key `broker`, a list); otherwise the top level
    # without the other program's table (one file may serve both).
    if section and isinstance(document.get(section), dict):
        table = document[section]
    elif section:
        others = {key for key, value in document.items() if key in PROGRAM_SECTIONS and isinstance(value, dict)}
        table = {key: value for key, value in document.items() if key not in others}
    else:
        table = document
    given = {str(key).replace("-", "_"): value for key, value in table.items()}
    values: dict[str, Any] = {}
    for f in _fields(cls):
        keys = [*f.metadata.get("aliases", ()), _option(f)]
        if f.metadata.get("file_only") and keys[-1] in document:
            given[keys[-1]] = document[keys[-1]]
        present = [key for key in keys if key in given]
        if present:
            values[f.name] = given[present[0]]
        for key in present:
            del given[key]
    if given:
        raise SettingsError(f"{where}: unknown keys {sorted(given)}")
    return values


def _read(f: dataclasses.Field[Any], kind: Any, value: Any, config: str) -> Any:
    parse: Callable[[Any], Any] | None = f.metadata.get("parse")
    if parse is None:
        try:
            return _convert(kind, value)
        except (TypeError, ValueError):
            raise SettingsError(f"{f.name} {value!r}: expected {_type_name(kind)}") from None
    try:
        return parse(value)
    except SettingsError:
        raise
    except ValueError as exc:  # the parser's own words, after where the value came from
        where = config if f.metadata.get("file_only") else f.name
        raise SettingsError(f"{where}: {exc}") from None


def load(
    cls: type[T],
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    section: str | None = None,
) -> T:
    """`cls` from the command line (read with `parser`), the environment and the config file.

    Raises SettingsError for a value that cannot be read (and whatever `cls` raises
    when it refuses the result).
    """
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    config_path = args.config or environ.get("POPGATE_CONFIG")
    file = f"{'--config' if args.config else 'POPGATE_CONFIG'} {config_path}"  # how the file was given
    config = read_config(cls, Path(config_path), section=section, where=file) if config_path else {}
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}  # field name -> where its value came from, as the user would write it
    for f in _fields(cls):
        raw, origin = None, ""
        if not f.metadata.get("file_only"):
            raw, origin = getattr(args, f.name), "--" + _option(f).replace("_", "-")
            if raw is None:
                origin = "POPGATE_" + _option(f).upper()
                raw = environ.get(origin)
            if raw is None and f.metadata.get("negate"):
                raw, origin = _negated(f, environ)
        if raw is None:
            raw, origin = config.get(f.name), f"{file}: {_option(f)}"
        if raw is None:
            continue
        origins[f.name] = origin
        try:
            values[f.name] = _read(f, hints[f.name], raw, file)
        except ValueError as exc:
            raise SettingsError(_attributed(str(exc), cls, origins)) from None
    try:
        return cls(**values)
    except ValueError as exc:
        raise SettingsError(_attributed(str(exc), cls, origins)) from None


def _negated(f: dataclasses.Field[Any], environ: Mapping[str, str]) -> tuple[bool | None, str]:
    """The value a bool field's negating variable (``POPGATE_NO_AUTO_CREATE``) gives it, if set."""
    variable = "POPGATE_" + str(f.metadata["negate"]).upper().replace("-", "_")
    if variable not in environ:
        return None, ""
    try:
        return not _convert(bool, environ[variable]), variable
    except ValueError:
        raise SettingsError(f"{variable} {environ[variable]!r}: expected bool") from None


def _attributed(message: str, cls: type[Any], origins: Mapping[str, str]) -> str:
    """`message` with the setting it starts with (flag or field name) replaced by where its value came from."""
    for f in _fields(cls):
        if f.name in origins:
            flag = "--" + _option(f).replace("_", "-")
            named = re.match(rf"(?:{re.escape(flag)}|{re.escape(f.name)})(?![\w-])", message)
            if named:
                return origins[f.name] + message[named.end() :]
    return message


def load_settings(
    cls: type[T],
    prog: str,
    argv: list[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    section: str | None = None,
) -> T:
    """`load`; a refused setting is one line on stderr and exit status 2 (the usage would bury it)."""
    parser = settings_parser(cls, prog)
    try:
        return load(cls, parser, argv, environ, section=section)
    except ValueError as exc:
        parser.exit(2, f"{prog}: {exc} (see {prog} --help)\n")
