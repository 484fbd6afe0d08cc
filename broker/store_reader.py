"""The SQLite store's reads (`broker.sqlite_store.SqliteStore`): one connection on one reader thread, beside the
writer, so a Pop's payloads or a scheduled message are read while commits go on."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from broker import store_reads
from broker.batches import PayloadEnds
from broker.store import PutHalf, PutScheduled, Record
from broker.store_writes import Cut
from popgate_contract.errors import StoreUnavailable
from popgate_process.throttled import Throttled

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreReader:
    def __init__(self, path: Path, connect: Callable[[], sqlite3.Connection]) -> None:
        self._path, self._connect = path, connect
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-reader")
        self.conn: sqlite3.Connection | None = None
        self._payload_ends = PayloadEnds()  # the reading thread's (`read_payloads`)
        self._failed = Throttled(log.error)

    def open(self) -> None:
        """Its connection now, not at the first read: the file it reads is the one the broker opened, whatever
        happens to the data directory's path or permissions meanwhile."""
        self.conn = self._connect()

    def _conn(self) -> sqlite3.Connection:
        if self.conn is None:
            self.conn = self._connect()
        return self.conn

    def _read(self, read: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """`read` on the reader thread, with its connection; a failure of the store's is StoreUnavailable (a
        Pop undoes its deliveries on it: broker.pop), logged at most every throttled.FAILURE_LOG_EVERY_S."""

        def run() -> T:
            try:
                return read(self._conn())
            except (sqlite3.Error, OSError) as exc:
                self._failed("store read failed: %s", exc)
                raise StoreUnavailable(f"store read failed ({self._path}): {exc}") from None

        return asyncio.get_running_loop().run_in_executor(self._reader, run)

    async def retained_from(self, targets: Sequence[Cut]) -> dict[tuple[str, int], int]:
        return await self._read(lambda conn: store_reads.retained_from(conn, targets))

    async def read_payloads(self, topic: str, wanted: Mapping[int, Sequence[int]]) -> dict[tuple[int, int], bytes]:
        if not any(wanted.values()):
            return {}
        return await self._read(lambda conn: store_reads.read_payloads(conn, self._payload_ends, topic, wanted))

    async def read_range(
        self, topic: str, queue_id: int, from_offset: int, limit: int, max_bytes: int | None
    ) -> list[Record]:
        return await self._read(
            lambda conn: store_reads.read_range(conn, topic, queue_id, from_offset, limit, max_bytes)
        )

    async def read_scheduled(self, schedule_ids: Sequence[int]) -> list[PutScheduled]:
        return await self._read(lambda conn: store_reads.read_scheduled(conn, schedule_ids))

    async def read_halves(self, half_ids: Sequence[int]) -> list[PutHalf]:
        return await self._read(lambda conn: store_reads.read_halves(conn, half_ids))

    def close(self) -> None:
        """After the last read: waits for a read running."""
        self._reader.shutdown(wait=True)
        if self.conn is not None:
            self.conn.close()
