"""Build a settings dataclass from flags, POPGATE_* environment variables and a TOML file.

One loader for both programs (`broker.settings`, `proxy.settings`): the dataclass
lists every option once, and the command line, the environment and the file are all
read through it; the dataclass validates the result when it is constructed.

Precedence: command-line flag > environment > config file (``--config`` or
POPGATE_CONFIG) > default. Every field ``foo_bar`` is flag ``--foo-bar``,
variable ``POPGATE_FOO_BAR`` and file key ``foo_bar`` (or ``foo-bar``), read as its
type. One file may serve both programs: its top-level keys are both programs' settings, and a program's own table
(``[broker]``, ``[proxy]``) adds to them and wins (`read_config`). A field's metadata may refine that:

- ``help``: the flag's help (otherwise "<type>, default <value>");
- ``negate``: for a bool, a flag that sets it false (``no-auto-create``), and its variable
  (``POPGATE_NO_AUTO_CREATE=1``; the field's own variable wins when both are set);
- ``option``: the flag, variable and file key when not the field's name (``broker``);
- ``aliases``: more file keys for it; the first one present wins over ``option``;
- ``parse``: a function reading the raw value (a string, a list of repeated flags or a TOML value);
- ``file_only``: no flag nor variable; with a `section`, the key at the top level wins over the section's
  table's (``[[acl]]``);
- ``choices``: the values taken, shown in ``--help`` (the dataclass still checks them, so an error names
  where the value came from);
- ``replaces``: old names of the setting (``("auth_token",)``); their flag, variable or file key is refused
  with the name to use instead (``--auth-token is now --broker-token``).

Units by name: a float field ending ``_s`` is a duration in seconds and also takes ``500ms``, ``30s``,
``2m``, ``1h30m``, ``7d`` (`parse_duration`); an int field ending ``_bytes`` is a size and also takes
``4KiB``, ``64MiB`` (`parse_size`). ``--help`` shows every default in those units.

An error about a setting starts with its flag or field name (``--receive-mode 'x': ...``,
``max_held must be >= 0``); the loader puts where the value came from in its place: the flag,
the variable (``POPGATE_RECEIVE_MODE 'x': ...``) or the file (``--config b.toml: max_held must ...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import os
import re
import socket
import tomllib
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from popgate_contract.validation import parse_host_port
from popgate_process.units import DURATION_FORMS, SIZE_FORMS, format_duration, format_size, parse_duration, parse_size

T = TypeVar("T")
PROGRAM_SECTIONS = frozenset(("broker", "proxy"))  # one file may hold a table for each program
# The shortest period of a background task (sweep, export, health check, DNS lookup, TLS reload): each costs a
# wake-up and some work, which a smaller value turns into a busy core.
MIN_INTERVAL_S = 0.1


class SettingsError(ValueError):
    """A setting is missing, unreadable or out of range; the message names it."""


def distribution_version(name: str = "popgate") -> str:
    """The installed version of the distribution `name` (what ``--version`` prints), "unknown" when not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


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
    if kind in (int, float) and isinstance(value, bool):  # a TOML `true` is no number (int(True) is 1)
        raise ValueError(value)
    if kind is int and isinstance(value, float):  # a TOML 1.9 is not truncated to 1: whole numbers only, as from text
        raise ValueError(value)
    return kind(value)


SETTINGS_EPILOG = (
    "Every flag --foo-bar is also the variable POPGATE_FOO_BAR and the key foo_bar of the --config file; a flag wins "
    f"over the environment, which wins over the file. Durations: {DURATION_FORMS}. Sizes: {SIZE_FORMS}."
)


class Replaced(argparse.Action):
    """An old spelling of an option: a usage error (exit code 2) naming the one to write instead ("--size is now
    --random-size SIZE"); hidden from --help. Its value, if any, goes with it, so the hint is the only error."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, now: str, **kwargs: Any) -> None:
        kwargs.update(nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.now = now

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: Any = None) -> None:
        parser.error(f"{option} is now {self.now}")


def _replaced(cls: type[Any]) -> dict[str, str]:
    """Each old name of a setting (``replaces``) -> the setting's option name, both with '_'."""
    return {old: _option(f) for f in _fields(cls) for old in f.metadata.get("replaces", ())}


def _unit_parser(f: dataclasses.Field[Any], kind: Any) -> Callable[[object], Any] | None:
    """The unit-aware reader a field's name and type call for (module docstring, "Units by name"), or None."""
    if kind is float and f.name.endswith("_s"):
        return parse_duration
    if kind is int and f.name.endswith("_bytes"):
        return parse_size
    return None


def _shown_default(f: dataclasses.Field[Any], kind: Any) -> str:
    """The field's default as --help shows it, in its units; "" for none (an empty string, list or path)."""
    default = f.default
    if default is dataclasses.MISSING or default in ("", (), None):
        return ""
    if kind is bool:
        return "on" if default else "off"
    unit = _unit_parser(f, kind)
    if unit is parse_duration:
        return format_duration(default)
    if unit is parse_size:
        return format_size(default)
    return str(default)


def _help(f: dataclasses.Field[Any], kind: Any) -> str:
    """A flag's help: the field's own words (else its kind), then its default; `%` escaped for argparse."""
    unit = _unit_parser(f, kind)
    text = f.metadata.get("help") or ("duration" if unit is parse_duration else "size" if unit else _type_name(kind))
    default = _shown_default(f, kind)
    return (f"{text} (default: {default})" if default else text).replace("%", "%%")


def _metavar(f: dataclasses.Field[Any], kind: Any) -> str:
    choices = f.metadata.get("choices")
    if choices:
        return "{" + ",".join(choices) + "}"
    unit = _unit_parser(f, kind)
    return "DURATION" if unit is parse_duration else "SIZE" if unit else _option(f).upper()


def settings_parser(cls: type[Any], prog: str, *, description: str | None = None) -> argparse.ArgumentParser:
    """The command line of `cls`: ``--version``, ``--config`` and a flag per field that is not ``file_only``, each
    with its default and, where a field has them, its choices (tests/unit/test_settings_units.py)."""
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=SETTINGS_EPILOG)
    parser.add_argument("--version", action="version", version=f"%(prog)s {distribution_version()}")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file of settings, keys as the long flags with '-' or '_' (env POPGATE_CONFIG)",
    )
    for f in _fields(cls):
        if f.metadata.get("file_only"):
            continue
        flag = "--" + _option(f).replace("_", "-")
        kind = hints[f.name]
        if kind is bool:
            parser.add_argument(flag, dest=f.name, action="store_true", default=None, help=_help(f, kind))
            negate = f.metadata.get("negate")
            if negate:
                variable = "POPGATE_" + negate.upper().replace("-", "_")
                parser.add_argument(
                    "--" + negate, dest=f.name, action="store_false", default=None, help=f"the opposite ({variable})"
                )
        else:
            action = "append" if typing.get_origin(kind) is tuple else "store"
            metavar = _metavar(f, kind)
            parser.add_argument(flag, dest=f.name, action=action, default=None, metavar=metavar, help=_help(f, kind))
    for old, new in _replaced(cls).items():
        parser.add_argument("--" + old.replace("_", "-"), action=Replaced, now="--" + new.replace("_", "-"))
    return parser


def read_config(cls: type[Any], path: Path, *, section: str | None = None, where: str = "") -> dict[str, Any]:
    """The file's settings by field name; unknown keys are an error, which starts with `where`
    (how the file was given, by default ``--config PATH``).

    With a `section`, the settings are the file's top level but for the programs' tables (`PROGRAM_SECTIONS`):
    what both programs share; then the ``[section]`` table's, which win over those. A key of either layer is read
    and checked alike, but for a top-level key this program does not know in a file with another program's table:
    that one is left to the other — tests/unit/test_settings_sources.py::test_top_level_keys_are_shared_beside_a_table.
    """
    where = where or f"--config {path}"
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"{where}: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8
        raise SettingsError(f"{where}: not UTF-8 text (byte {exc.start}: {exc.object[exc.start]:#04x})") from None
    if not section:
        return _table_values(cls, document, where)
    # A program's table is a table (the proxy's own key `broker` is a list, a setting).
    shared = {
        key: value for key, value in document.items() if not (key in PROGRAM_SECTIONS and isinstance(value, dict))
    }
    # Beside another program's table the file is shared: a top-level key this program does not know is taken for
    # the other's (the proxy's [[acl]]) — test_settings_sources.py::test_top_level_keys_are_shared_beside_a_table.
    others = any(isinstance(document.get(name), dict) for name in PROGRAM_SECTIONS - {section})
    values = _table_values(cls, shared, where, unknown_ok=others)
    own = document.get(section)
    if isinstance(own, dict):
        values.update(_table_values(cls, own, where))
        for f in _fields(cls):  # a file_only key at the top level wins over the table's (``[[acl]]``)
            if f.metadata.get("file_only") and _option(f) in document:
                values[f.name] = document[_option(f)]
    return values


def _table_values(cls: type[Any], table: Mapping[str, Any], where: str, *, unknown_ok: bool = False) -> dict[str, Any]:
    """The settings of one table by field name; a replaced key is an error starting with `where`, and so is an
    unknown one unless `unknown_ok` (the shared top level of a file another program reads too)."""
    given = {str(key).replace("-", "_"): value for key, value in table.items()}
    values: dict[str, Any] = {}
    for f in _fields(cls):
        keys = [*f.metadata.get("aliases", ()), _option(f)]
        present = [key for key in keys if key in given]
        if present:
            values[f.name] = given[present[0]]
        for key in present:
            del given[key]
    for old, new in _replaced(cls).items():
        if old in given:
            raise SettingsError(f"{where}: {old} is now {new}")
    if given and not unknown_ok:
        raise SettingsError(f"{where}: unknown keys {sorted(given)}")
    return values


def _read(f: dataclasses.Field[Any], kind: Any, value: Any, config: str) -> Any:
    parse: Callable[[Any], Any] | None = f.metadata.get("parse")
    unit = _unit_parser(f, kind)
    if parse is None and unit is not None:
        try:
            return unit(value)
        except ValueError as exc:  # its words start with the value: "--max-body-bytes '4MB': sizes are ..."
            raise SettingsError(f"{f.name} {exc}") from None
    if kind is Path and not str(value).strip():  # Path("") is the working directory: never what was meant
        raise SettingsError(f"{f.name} must not be empty")
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
    for old, new in _replaced(cls).items():
        if "POPGATE_" + old.upper() in environ:
            raise SettingsError(f"POPGATE_{old.upper()} is now POPGATE_{new.upper()}")
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
