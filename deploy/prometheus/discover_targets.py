#!/usr/bin/env python3
"""Find the /metrics endpoints of a running `popgate up` and write Prometheus file_sd targets.

`popgate up` starts its brokers and proxy as child processes; each one gets its
metrics address as `--metrics-listen HOST:PORT` (or `POPGATE_METRICS_LISTEN`, or
`metrics_listen` in a `--config` TOML file). This reads those from /proc (Linux),
so it works whatever ports `popgate up` picked. Where a port is 0 (any free
port), it looks at the sockets the process listens on and asks each for
/metrics. So this works today, with children inheriting the environment:

    POPGATE_METRICS_LISTEN=127.0.0.1:0 popgate up --no-view &
    python deploy/prometheus/discover_targets.py --pid $! \
        --out deploy/prometheus/targets/popgate.json

and `prometheus --config.file=deploy/prometheus/prometheus-file-sd.yml` picks the
file up. Standard library only; tests/deploy imports it.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import sys
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
KINDS = ("broker", "proxy")


@dataclass(frozen=True)
class Process:
    """One popgate server process found under `popgate up`."""

    pid: int
    kind: str  # "broker" | "proxy"
    name: str  # broker name, or "proxy-<pid>"
    listen: str | None  # gRPC address, as a client reaches it
    metrics: str | None  # metrics address, as a client reaches it

    @property
    def job(self) -> str:
        return f"popgate-{self.kind}"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # the process went away, or is not ours to read
        return b""


def descendants(root: int) -> list[int]:
    """Every process below `root` in the process tree (children, grandchildren...)."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read(entry / "stat").decode(errors="replace")
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1:
            parents[int(entry.name)] = int(fields[1])
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        kids = [child for child, parent in parents.items() if parent == pid]
        found.extend(kids)
        frontier.extend(kids)
    return sorted(found)


def _kind(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "-m" and i + 1 < len(argv):
            module = argv[i + 1].split(".")[0]
            return module if module in KINDS else None
        base = os.path.basename(arg)
        if base in ("popgate-broker", "popgate-proxy"):
            return base.removeprefix("popgate-")
        if arg.startswith("-"):  # an interpreter option, e.g. -u
            continue
        if i > 0 and not base.startswith("python"):
            return None
    return None


def _flag(argv: list[str], name: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def _setting(argv: list[str], env: dict[str, str], flag: str) -> str | None:
    """A setting as the process sees it: flag, then POPGATE_<FLAG>, then the config file."""
    value = _flag(argv, "--" + flag)
    if value is None:
        value = env.get("POPGATE_" + flag.upper().replace("-", "_"))
    config = _flag(argv, "--config") or env.get("POPGATE_CONFIG")
    if value is None and config:
        try:
            data = tomllib.loads(Path(config).read_text())
        except (OSError, tomllib.TOMLDecodeError):
            data = {}
        for section in (data, *(v for v in data.values() if isinstance(v, dict))):
            for key in (flag, flag.replace("-", "_")):
                if isinstance(section.get(key), str):
                    return str(section[key])
    return value or None


def reachable(address: str | None) -> str | None:
    """A listen address as a local client dials it (0.0.0.0 -> 127.0.0.1)."""
    if not address:
        return None
    host, _, port = address.rpartition(":")
    if host in ("", "0.0.0.0", "*"):
        host = "127.0.0.1"
    elif host in ("[::]", "::"):
        host = "[::1]"
    return f"{host}:{port}"


def listening(pid: int) -> list[str]:
    """The TCP addresses process `pid` listens on (from its fds and /proc/<pid>/net/tcp{,6})."""
    inodes = set()
    try:
        fds = list((PROC / str(pid) / "fd").iterdir())
    except OSError:
        return []
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in _read(PROC / str(pid) / "net" / table).decode().splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hex_ip, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_ip)
            # The kernel prints each 32-bit word in host (little-endian) order.
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            ip = socket.inet_ntop(family, packed).removeprefix("::ffff:")  # IPv4-mapped: plain IPv4
            host = f"[{ip}]" if ":" in ip else ip
            found.append(reachable(f"{host}:{int(hex_port, 16)}") or "")
    return sorted(set(found) - {""})


def serves_metrics(address: str, timeout: float = 1.0) -> bool:
    """Whether http://address/metrics answers with a Prometheus exposition."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as response:
            return response.status == 200 and b"# TYPE " in response.read(1 << 20)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
        return False


def _unresolved(address: str | None) -> bool:
    return address is None or address.endswith(":0")


def inspect(pid: int, *, probe: bool = True) -> Process | None:
    """The popgate server running as `pid`, or None if it is something else.

    With `probe`, addresses given with port 0 (or not at all) are resolved from
    the sockets the process listens on: the one serving /metrics is the metrics
    address, the other one its gRPC address.
    """
    argv = [a.decode(errors="replace") for a in _read(PROC / str(pid) / "cmdline").split(b"\0") if a]
    kind = _kind(argv)
    if kind is None:
        return None
    env = {}
    for item in _read(PROC / str(pid) / "environ").split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep and key.startswith("POPGATE_"):
            env[key] = value
    name = _setting(argv, env, "name") if kind == "broker" else None
    listen = reachable(_setting(argv, env, "listen"))
    metrics = reachable(_setting(argv, env, "metrics-listen"))
    if probe and (_unresolved(listen) or _unresolved(metrics)):
        addresses = listening(pid)
        http = [a for a in addresses if serves_metrics(a)]
        other = [a for a in addresses if a not in http]
        if _unresolved(metrics):
            metrics = http[0] if len(http) == 1 else None
        if _unresolved(listen):
            listen = other[0] if len(other) == 1 else None
    return Process(pid=pid, kind=kind, name=name or f"{kind}-{pid}", listen=listen, metrics=metrics)


def discover(root: int) -> list[Process]:
    """The brokers and proxies started (directly or not) by process `root`."""
    found = [p for p in map(inspect, descendants(root)) if p is not None]
    return sorted(found, key=lambda p: (p.kind, p.name))


def file_sd(processes: list[Process]) -> list[dict[str, object]]:
    """Prometheus file_sd target groups, one per process that serves metrics."""
    return [{"targets": [p.metrics], "labels": {"job": p.job, "process": p.name}} for p in processes if p.metrics]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="pid of `popgate up`")
    parser.add_argument(
        "--out", type=Path, help="file_sd JSON file to write, its directory made if need be (default: stdout)"
    )
    args = parser.parse_args(argv)
    processes = discover(args.pid)
    missing = [p.name for p in processes if not p.metrics]
    if missing:
        print(f"no metrics address for: {', '.join(missing)}", file=sys.stderr)
    text = json.dumps(file_sd(processes), indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)  # the targets/ directory on a first run
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(args.out)  # Prometheus never sees half a file
        except OSError as exc:
            print(f"discover_targets: cannot write --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 0 if processes and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
