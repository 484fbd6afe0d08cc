"""Whether the files a broker opened in its data directory are still the ones at their paths: a data directory
deleted or replaced under a running broker (`rm -rf`, a restore over it) leaves the broker writing into unlinked
files that the next start never sees, and a second broker can then take the directory (its LOCK went too). The
sweep asks `moved` once a second; a broker whose files moved refuses writes and reports NOT_SERVING
(broker.sqlite_store `SqliteStore.files_moved`) — tests/unit/broker/test_store_files.py.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

Identity = tuple[int, int]  # (st_dev, st_ino)


def identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino)


def moved(opened: Mapping[Path, Identity]) -> str | None:
    """What happened to the first of the `opened` files (path: the identity it had when opened) no longer at its
    path, or None when all are. A path that cannot be looked at (no permission) is taken as unchanged: reads and
    writes then fail on their own, with their own error."""
    for path, opened_as in opened.items():
        try:
            now = identity(os.stat(path))
        except FileNotFoundError:
            return f"{path} was deleted while the broker had it open"
        except OSError:
            continue
        if now != opened_as:
            return f"{path} was replaced by another file while the broker had it open"
    return None
