"""Whether a store's files are still those at their paths (broker.store_files), and a store whose data directory
went refusing writes."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from broker import store_files
from broker.sqlite_store import SqliteStore
from broker.store import NewMessage
from popgate_contract.errors import StoreUnavailable


def test_files_still_at_their_paths_have_not_moved(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    assert store_files.moved({path: store_files.identity(os.stat(path))}) is None


def test_a_deleted_or_replaced_file_has_moved(tmp_path: Path) -> None:
    deleted, replaced = tmp_path / "deleted", tmp_path / "replaced"
    for path in (deleted, replaced):
        path.write_bytes(b"x")
    opened = {path: store_files.identity(os.stat(path)) for path in (deleted, replaced)}
    with open(replaced, "rb"):  # held open: its inode cannot be reused by the new file
        replaced.unlink()
        replaced.write_bytes(b"y")
        assert (
            store_files.moved({replaced: opened[replaced]})
            == f"{replaced} was replaced by another file while the broker had it open"
        )
        deleted.unlink()
        assert store_files.moved(opened) == f"{deleted} was deleted while the broker had it open"


async def test_a_store_whose_directory_was_deleted_refuses_writes(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "b1")
    store.start(asyncio.get_running_loop())
    try:
        await store.submit([NewMessage("t", 0, 1, None, b"a")], [])
        assert store.files_moved() is None
        shutil.rmtree(tmp_path / "b1")
        assert store.files_moved() == f"{tmp_path / 'b1' / 'LOCK'} was deleted while the broker had it open"
        with pytest.raises(StoreUnavailable, match="was deleted"):
            await store.submit([NewMessage("t", 0, 2, None, b"b")], [])
    finally:
        await store.close()
