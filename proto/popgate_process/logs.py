"""The logging of popgate's programs: text or JSON lines on stderr, configured by an entry point only."""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import IO

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
TEXT_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601, ms), ``level``, ``logger``, ``message``, and
    ``exception`` / ``stack`` when the record has them; newlines inside stay escaped
    (tests/unit/test_settings_units.py)."""

    def format(self, record: logging.LogRecord) -> str:
        at = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        entry = {
            "time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text", stream: IO[str] | None = None) -> None:
    """The process's logging, for an entry point: one handler on `stream` (stderr), `level` (any case),
    lines as text or as JSON objects (`JsonLogFormatter`); handlers set before are replaced."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLogFormatter() if log_format == "json" else logging.Formatter(TEXT_LOG_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
