"""A small authoritative DNS server on 127.0.0.1 (UDP, a thread) whose SRV and A records a test changes while
it runs: the records a Kubernetes headless Service publishes for a StatefulSet, for broker discovery tests."""

from __future__ import annotations

import socket
import threading
from types import TracebackType

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

TTL_S = 1


class DnsServer:
    def __init__(self) -> None:
        self.srv: dict[str, list[tuple[str, int]]] = {}  # SRV name → (target, port), names absolute ("x.test.")
        self.a: dict[str, str] = {}  # name → IPv4 address
        self.silent = False  # True: queries go unanswered (a nameserver down)
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="dns-server", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._sock.getsockname()
        return f"{host}:{port}"

    def publish(self, srv_name: str, targets: dict[str, tuple[str, int]]) -> None:
        """`srv_name` lists `targets` (target name → (IPv4, port)) from now on, and nothing else."""
        with self._lock:
            self.srv[srv_name] = [(target, port) for target, (_, port) in sorted(targets.items())]
            self.a.update({target: ip for target, (ip, _) in targets.items()})

    def _answer(self, query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        question = query.question[0]
        name = question.name.to_text()
        with self._lock:
            if question.rdtype == dns.rdatatype.SRV and name in self.srv:
                records = [f"0 0 {port} {target}" for target, port in self.srv[name]]
                if records:
                    response.answer.append(dns.rrset.from_text_list(question.name, TTL_S, "IN", "SRV", records))
            elif question.rdtype == dns.rdatatype.A and name in self.a:
                response.answer.append(dns.rrset.from_text(question.name, TTL_S, "IN", "A", self.a[name]))
            elif name not in self.srv and name not in self.a:
                response.set_rcode(dns.rcode.NXDOMAIN)
        return response

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(4096)
            except TimeoutError:
                continue
            if self.silent:
                continue
            try:
                reply = self._answer(dns.message.from_wire(data)).to_wire()
            except Exception:  # a datagram that is not a query: no answer, as a real server
                continue
            self._sock.sendto(reply, peer)

    def __enter__(self) -> DnsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
