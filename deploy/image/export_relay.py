#!/usr/bin/env python3
"""Carry finished metric exports from the broker and proxy pods to the Spark job, with no shared volume.

    popgate-export-relay serve --dir DIR [--listen HOST:PORT] [--keep-s S] [--max-bytes N]
    popgate-export-relay collect --service NAME --into DIR [--port PORT] [--timeout-s S]

serve (a sidecar beside every broker and proxy): answers ``GET /files`` with the finished export files
of DIR (``<kind>-<process>-....jsonl``, never the hidden in-progress ones) as JSON, ``GET /files/<name>``
with one of them and ``GET /healthz`` with ``ok``; nothing else, and nothing outside DIR. Every minute it
deletes its finished files older than --keep-s, then, while they add up to more than --max-bytes, the
oldest of those it has served whole (collected) and then the oldest of the others, so the directory stays
bounded whether or not anyone collects. Deleting a file it has not served is logged on stderr, one line
per prune: the CronJob lost it (--max-bytes is too small for the export rate; docs/DEPLOY.md).

collect (an init container of the Spark CronJob): resolves NAME (a headless Service: one address per
pod) and copies every finished file a pod lists and DIR lacks into DIR, under a hidden name first and
renamed when whole, with the file's own modification time. A finished file never changes, so a name
present in DIR is done. Exit status 0 when at least one pod answered (the others are named on stderr),
1 when none did.

Standard library only: the server image runs it with the servers' Python. docs/DEPLOY.md, "Metrics
export", says why the data plane has no shared volume.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Container, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# A finished export file (proto/popgate_process/export.py): kind, process, start, roll period, sequence.
FINISHED = re.compile(r"(broker|proxy)-[A-Za-z0-9_.-]+\.jsonl")
DEFAULT_PORT = 9180
PRUNE_EVERY_S = 60.0
CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    size: int
    mtime: float


def finished_files(directory: Path) -> list[Entry]:
    """The finished export files directly in `directory`, oldest first (none when it does not exist yet)."""
    entries = []
    try:
        candidates = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    for item in candidates:
        if not FINISHED.fullmatch(item.name):
            continue
        try:
            stat = item.stat(follow_symlinks=False)
        except FileNotFoundError:  # pruned or moved meanwhile
            continue
        if item.is_file(follow_symlinks=False):
            entries.append(Entry(item.name, stat.st_size, stat.st_mtime))
    return sorted(entries, key=lambda e: (e.mtime, e.name))


def prune(
    directory: Path, *, keep_s: float, max_bytes: int, now: float, collected: Container[str] = frozenset()
) -> list[str]:
    """Delete finished files older than `keep_s`, then while the rest exceed `max_bytes` the oldest `collected`
    ones, then the oldest others (tests/deploy/test_image_helpers.py::test_prune_deletes_collected_files_first)."""
    entries = finished_files(directory)
    doomed = [e for e in entries if e.mtime < now - keep_s]
    kept = sorted((e for e in entries if e.mtime >= now - keep_s), key=lambda e: e.name not in collected)
    total = sum(e.size for e in kept)
    while kept and total > max_bytes:
        oldest = kept.pop(0)
        total -= oldest.size
        doomed.append(oldest)
    for entry in doomed:
        (directory / entry.name).unlink(missing_ok=True)
    return [e.name for e in doomed]


def _handler(directory: Path, collected: set[str]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "popgate-export-relay"

        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._send(200, b"ok\n", "text/plain")
            elif self.path == "/files":
                listing = [{"name": e.name, "size": e.size, "mtime": e.mtime} for e in finished_files(directory)]
                self._send(200, json.dumps(listing).encode(), "application/json")
            elif self.path.startswith("/files/") and FINISHED.fullmatch(self.path.removeprefix("/files/")):
                self._send_file(directory / self.path.removeprefix("/files/"))
            else:
                self._send(404, b"not found\n", "text/plain")

        def _send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _send_file(self, path: Path) -> None:
            try:
                file = path.open("rb")
            except FileNotFoundError:  # pruned since it was listed
                self._send(404, b"not found\n", "text/plain")
                return
            with file:
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Content-Length", str(os.fstat(file.fileno()).st_size))
                self.end_headers()
                while chunk := file.read(CHUNK):
                    self.wfile.write(chunk)
            collected.add(path.name)  # sent whole; a collector that fails after this fetches it again

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per request would drown the pod's log; errors surface at the collector

    return Handler


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def prune_and_report(directory: Path, *, keep_s: float, max_bytes: int, collected: set[str]) -> None:
    """One prune, logged: the files deleted, and on stderr those never collected (lost to the Spark job)."""
    try:
        gone = prune(directory, keep_s=keep_s, max_bytes=max_bytes, now=time.time(), collected=collected)
    except OSError as exc:
        print(f"export-relay: cannot prune {directory}: {exc}", file=sys.stderr, flush=True)
        return
    lost = [name for name in gone if name not in collected]
    collected.difference_update(gone)
    if gone:
        print(f"export-relay: deleted {len(gone)} finished files from {directory}", flush=True)
    if lost:
        print(
            f"export-relay: deleted {len(lost)} finished files never collected (oldest {lost[0]}, newest "
            f"{lost[-1]}): the Spark job will not count them; raise --max-bytes (and the volume) or collect "
            'more often (docs/DEPLOY.md, "Metrics export")',
            file=sys.stderr,
            flush=True,
        )


def serve(directory: Path, *, listen: str, keep_s: float, max_bytes: int, prune_every_s: float = PRUNE_EVERY_S) -> int:
    host, port = _host_port(listen)
    collected: set[str] = set()  # served whole since this relay started (a restarted relay knows none)
    server = ThreadingHTTPServer((host, port), _handler(directory, collected))
    server.daemon_threads = True
    stop = threading.Event()

    def pruner() -> None:
        while not stop.wait(prune_every_s):
            prune_and_report(directory, keep_s=keep_s, max_bytes=max_bytes, collected=collected)

    def on_term(signum: int, frame: object) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=pruner, name="prune", daemon=True).start()
    print(f"export-relay: serving finished files of {directory} on {host}:{server.server_address[1]}", flush=True)
    with server:
        server.serve_forever()
    return 0


def resolve(service: str, port: int) -> list[str]:
    """Every address `service` resolves to (one per pod behind a headless Service)."""
    infos = socket.getaddrinfo(service, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def _url(address: str, port: int, path: str) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{path}"


def fetch(address: str, port: int, entry: Entry, into: Path, timeout_s: float) -> None:
    """Copy one finished file: a hidden temporary name (which no reader lists), renamed once whole."""
    partial = into / f".{entry.name}.tmp"
    try:
        with urllib.request.urlopen(_url(address, port, f"/files/{entry.name}"), timeout=timeout_s) as answer:
            with partial.open("wb") as out:
                while chunk := answer.read(CHUNK):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
        if partial.stat().st_size != entry.size:
            raise OSError(f"{entry.name}: got {partial.stat().st_size} bytes of {entry.size}")
        os.utime(partial, (entry.mtime, entry.mtime))
        partial.rename(into / entry.name)
    finally:
        partial.unlink(missing_ok=True)


def collect_from(address: str, port: int, into: Path, timeout_s: float) -> int:
    """The files copied from one pod."""
    with urllib.request.urlopen(_url(address, port, "/files"), timeout=timeout_s) as answer:
        listing = [Entry(str(e["name"]), int(e["size"]), float(e["mtime"])) for e in json.load(answer)]
    copied = 0
    for entry in listing:
        if FINISHED.fullmatch(entry.name) and not (into / entry.name).exists():
            try:
                fetch(address, port, entry, into, timeout_s)
            except urllib.error.HTTPError as exc:
                if exc.code == 404:  # pruned by the pod since it listed it
                    continue
                raise
            copied += 1
    return copied


def collect(service: str, *, port: int, into: Path, timeout_s: float) -> int:
    into.mkdir(parents=True, exist_ok=True)
    try:
        addresses = resolve(service, port)
    except socket.gaierror as exc:
        print(f"export-relay: {service}: {exc.strerror}", file=sys.stderr)
        return 1
    copied, failed = 0, []
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = {a: pool.submit(collect_from, a, port, into, timeout_s) for a in addresses}
        for address, future in futures.items():
            try:
                copied += future.result()
            except (OSError, ValueError, KeyError) as exc:  # URLError and timeouts are OSErrors
                failed.append(address)
                print(f"export-relay: {address}: {exc}", file=sys.stderr)
    print(f"export-relay: copied {copied} files from {len(addresses) - len(failed)} of {len(addresses)} pods")
    return 0 if len(failed) < len(addresses) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="popgate-export-relay", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve", help="serve and prune the finished export files of a directory")
    s.add_argument("--dir", type=Path, required=True, help="the export directory (POPGATE_EXPORT_DIR)")
    s.add_argument("--listen", default=f"0.0.0.0:{DEFAULT_PORT}", help="HOST:PORT, default %(default)s")
    s.add_argument("--keep-s", type=float, default=7200.0, help="seconds a finished file is kept, default 7200")
    s.add_argument("--max-bytes", type=int, default=256 << 20, help="bytes of finished files kept, default 256 MiB")
    s.add_argument("--prune-every-s", type=float, default=PRUNE_EVERY_S, help="default %(default)s")
    c = commands.add_parser("collect", help="copy the finished files of every pod behind a headless Service")
    c.add_argument("--service", required=True, help="DNS name with one address per pod")
    c.add_argument("--into", type=Path, required=True, help="directory the Spark job reads")
    c.add_argument("--port", type=int, default=DEFAULT_PORT, help="the pods' serve port, default %(default)s")
    c.add_argument("--timeout-s", type=float, default=10.0, help="per request, default %(default)s")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return serve(
            args.dir, listen=args.listen, keep_s=args.keep_s, max_bytes=args.max_bytes, prune_every_s=args.prune_every_s
        )
    return collect(args.service, port=args.port, into=args.into, timeout_s=args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
