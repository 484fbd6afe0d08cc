"""The export files of popgate_process.export: the in-progress file of a roll period, published by a rename, and
the salvage of those an earlier run left in progress."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from popgate_process.export import ExportSettings

log = logging.getLogger("popgate_process.export")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(process: str) -> str:
    """`process` as it appears in file names."""
    return _UNSAFE.sub("_", process)


OPEN_TRIES = 5


class RollingFile:
    """The in-progress hidden file of one roll period; `publish` makes it a final ``.jsonl`` file."""

    def __init__(self, settings: ExportSettings) -> None:
        self.settings = settings
        self.dir = Path(settings.export_dir)
        self.stem = f"{settings.kind}-{safe_name(settings.process)}-{int(settings.started * 1000)}"
        self.period: int | None = None
        self.seq = 0
        self._begun = 0.0  # the monotonic time the in-progress file was begun at
        self._fd: int | None = None  # the in-progress file, written unbuffered (see `append`)
        self._dir_fd: int | None = None  # the directory it was made in, wherever that is moved (see `publish`)

    def _names(self) -> tuple[Path, Path]:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime((self.period or 0) * self.settings.roll_period_s))
        name = f"{self.stem}-{stamp}-{self.seq:06d}.jsonl"
        return self.dir / f".{name}.tmp", self.dir / name

    def append(self, data: bytes, now: float, monotonic: float) -> None:
        """Append one snapshot's lines whole, or raise and leave none of them in the file. `now` is the
        snapshot's wall time, `monotonic` the monotonic clock then: the file is published first when `now`
        is in another roll period, or a roll period has passed on the monotonic clock since it was begun —
        tests/unit/process/test_export.py::
        test_files_roll_over_each_roll_period_of_the_monotonic_clock_whatever_step_the_wall_clock_took.

        Written with os.write, no buffer: a write that fails (disk full) leaves nothing behind to be
        written later, after the part already on disk is cut off, in the middle of a line."""
        roll_s = self.settings.roll_period_s
        period = int(now // roll_s)
        if self._fd is not None and (period != self.period or monotonic - self._begun >= roll_s):
            self.publish()
        if self._fd is not None and not _same_file(self._fd, self._names()[0]):
            self._set_aside(self._fd)
        if self._fd is None:
            self.period, self._begun = period, monotonic
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = self._open_locked()
        fd = self._fd
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            try:
                os.ftruncate(fd, end)  # no half snapshot (nor half line) before the next one
            except OSError:  # it stays cut in this file: go on in a new one (`salvage` keeps its whole lines)
                self._close()
                self.seq += 1
            raise

    def _set_aside(self, fd: int) -> None:
        """The in-progress file is no longer at its name (its directory deleted, moved away or replaced): published
        where it now is when its directory was moved, else named in the warning; the next snapshot goes to a new
        file at the export path — tests/unit/process/test_export.py::
        test_an_export_dir_rotated_away_has_its_in_progress_file_published_where_it_went,
        ::test_an_export_dir_deleted_or_replaced_is_made_again_and_written_in_a_new_file."""
        tmp, final = self._names()
        assert self._dir_fd is not None
        moved = _path_of(self._dir_fd)
        if not _same_file(fd, tmp.name, self._dir_fd):
            self._close()
            self.seq += 1
            log.warning("export file %s is gone (its directory deleted?): going on in a new one", tmp)
            return
        try:
            self.publish()
        except OSError as exc:
            self.seq += 1
            log.warning(
                "export file %s was moved away with its directory and cannot be published (%s): left there as %s; "
                "going on in a new one",
                tmp,
                exc.strerror or exc,
                f"{moved}/{tmp.name}",
            )
            return
        log.warning(
            "export directory %s was moved away: its file published as %s; going on in a new one",
            self.dir,
            f"{moved}/{final.name}",
        )

    def _open_locked(self) -> int:
        """The in-progress file, open and locked (`flock`: "being written", so `salvage` leaves it alone; held
        until it is renamed), and its directory's fd kept. Another process of the same name may take a file in the
        moment between its creation and the lock: then the next name is used (a few times at most)."""
        dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for _ in range(OPEN_TRIES):
                name = self._names()[0].name
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644, dir_fd=dir_fd)
                fcntl.flock(fd, fcntl.LOCK_EX)  # a salvaging process holds it for a moment at most
                if _same_file(fd, name, dir_fd):
                    self._dir_fd, dir_fd = dir_fd, -1
                    return fd
                os.close(fd)
                self.seq += 1
        finally:
            if dir_fd >= 0:
                os.close(dir_fd)
        raise OSError(f"export files in {self.dir} are taken as soon as made: another process of this name?")

    def publish(self) -> Path | None:
        """fsync the in-progress file and rename it to its final name in the directory it was made in (atomic within
        it, wherever that directory was moved since), the lock held until the rename is done."""
        if self._fd is None or self._dir_fd is None:
            return None
        tmp, final = self._names()
        try:
            os.fsync(self._fd)
            os.replace(tmp.name, final.name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            with contextlib.suppress(OSError):  # not every file system lets a directory be fsynced
                os.fsync(self._dir_fd)
        finally:
            self._close()
        self.seq += 1
        return final

    def _close(self) -> None:
        for fd in (self._fd, self._dir_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._dir_fd = None


def _same_file(fd: int, path: Path | str, dir_fd: int | None = None) -> bool:
    """Whether `path` (relative to `dir_fd` if given) is the file open as `fd`."""
    opened = os.fstat(fd)
    try:
        now = os.stat(path, dir_fd=dir_fd)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (opened.st_dev, opened.st_ino)


def _path_of(dir_fd: int) -> str:
    """Where the directory open as `dir_fd` is now (from Linux's /proc)."""
    try:
        return os.readlink(f"/proc/self/fd/{dir_fd}")
    except OSError:
        return "(its moved directory)"


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every file system lets a directory be fsynced
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def salvage(export_dir: Path, kind: str, process: str) -> list[Path]:
    """Publish what an earlier incarnation of this process left in progress (killed before rolling).

    Only whole lines are kept; the files are then renamed like any finished file. A file a running process
    still writes (it holds a lock on it until it publishes it or dies) is left alone: another process of the
    same name, started by mistake or while the first one is still stopping, must not make it final. A file it
    cannot open or rename (another user's, a read-only file system) is logged and left for a later start —
    tests/unit/process/test_export.py::test_a_leftover_it_cannot_open_is_skipped_and_the_others_are_published.
    """
    out: list[Path] = []
    prefix = f".{kind}-{safe_name(process)}-"
    # This process's files exactly: broker "b" must not take running broker "b-2"'s file (".broker-b-2-...").
    ours = re.compile(re.escape(prefix) + r"\d+-\d{8}T\d{6}Z-\d+\.jsonl\.tmp")
    for tmp in sorted(Path(export_dir).glob(f"{prefix}*.jsonl.tmp")):
        if not ours.fullmatch(tmp.name):
            continue
        try:
            final = _salvage_one(tmp)
        except OSError as exc:
            log.warning("cannot publish %s, left by an earlier run: %s", tmp, exc.strerror or exc)
            continue
        if final is not None:
            out.append(final)
    if out:
        _fsync_dir(Path(export_dir))
    return out


def _salvage_one(tmp: Path) -> Path | None:
    """`tmp` cut after its last whole line and published; None when a live writer holds it or published it."""
    try:
        f = tmp.open("r+b")
    except FileNotFoundError:
        return None  # its writer published it meanwhile
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # its writer is alive
        try:
            if os.stat(tmp).st_ino != os.fstat(f.fileno()).st_ino:
                return None  # published (renamed) between the open and the lock
        except FileNotFoundError:
            return None
        data = f.read()
        whole = data[: data.rfind(b"\n") + 1]
        if whole != data:
            f.truncate(len(whole))
            os.fsync(f.fileno())
        final = tmp.with_name(tmp.name[1 : -len(".tmp")])
        os.replace(tmp, final)
    return final
