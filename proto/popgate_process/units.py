"""Durations and sizes as people write them: ``500ms``, ``1h30m``, ``64MiB`` (the settings of every program and the
`popgate` command read them; tests/unit/test_settings_units.py)."""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

# Durations: seconds, or numbers with units, summed (``1h30m``). Sizes: bytes, or a number with a 1024-based unit.
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)"
_DURATION = re.compile(f"(?:{_DURATION_PART})+")
_SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
_DECIMAL_UNITS = {"k": "KiB", "kb": "KiB", "m": "MiB", "mb": "MiB", "g": "GiB", "gb": "GiB", "t": "TiB", "tb": "TiB"}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]*)")
DURATION_FORMS = "seconds (2.5) or with a unit: 500ms, 30s, 2m, 1h30m, 7d"
SIZE_FORMS = "bytes (4096) or with a unit: 4KiB, 64MiB, 1GiB"


def parse_duration(value: object) -> float:
    """Seconds from a number (seconds) or a text such as ``2.5``, ``500ms``, ``30s``, ``2m``, ``1h30m``, ``7d``;
    ValueError naming the forms taken otherwise (tests/unit/test_settings_units.py)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration: give {DURATION_FORMS}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            if not _DURATION.fullmatch(text):
                raise ValueError(f"{text!r} is not a duration: give {DURATION_FORMS}") from None
            seconds = sum(float(n) * _DURATION_UNITS[unit] for n, unit in re.findall(_DURATION_PART, text))
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a finite duration")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from an integer or a text such as ``4096``, ``4KiB``, ``64MiB``, ``1.5GiB`` (units are 1024-based);
    ValueError otherwise. ``64MB``, ``64M`` are refused with the 1024-based spelling to use instead: ``MB`` is
    10^6 bytes to some and 2^20 to others (tests/unit/test_settings_units.py)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    match = _SIZE.fullmatch(text)
    if match is None or isinstance(value, bool):
        raise ValueError(f"{text!r} is not a size: give {SIZE_FORMS}")
    number, unit = match[1], match[2].lower()
    if unit in _DECIMAL_UNITS:
        raise ValueError(f"{text!r}: sizes are 1024-based, write {number}{_DECIMAL_UNITS[unit]} (or the bytes)")
    if unit not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size: give {SIZE_FORMS}")
    try:
        exact = Decimal(number) * _SIZE_UNITS[unit]
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a size: give {SIZE_FORMS}") from None
    if exact != exact.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(exact)


def format_duration(seconds: float) -> str:
    """`seconds` as `parse_duration` reads it back: ``12h``, ``5m``, ``10s``, ``300ms``, ``2.5s``."""
    for unit in ("d", "h", "m", "s"):
        whole = seconds / _DURATION_UNITS[unit]
        if seconds >= _DURATION_UNITS[unit] and whole == int(whole):
            return f"{int(whole)}{unit}"
    millis = round(seconds * 1000, 6)
    if 0 < seconds < 1 and millis == int(millis):
        return f"{int(millis)}ms"
    return f"{seconds:g}s"


def format_size(size: int) -> str:
    """`size` as `parse_size` reads it back: ``4MiB``, ``256KiB``, ``1000B``."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = _SIZE_UNITS[unit.lower()]
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"
