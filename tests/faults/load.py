"""Steady load through the proxy for the fault tests: one producer, several consumers (raw v2 client),
every outcome counted so a test can say what was lost, duplicated or failed, and when."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
from popgate_pb.v2 import definition_pb2 as v2

from tests.integration.proxy.client import V2Client

ERROR_PAUSE_S = 0.2  # a client backs off after an error instead of spinning


class Client(V2Client):
    """V2Client whose calls wait for the channel to be ready (within their deadline) instead of failing at
    once while the proxy is down, as a client with retries would: only calls in flight at a fault fail."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        stub = self.stub
        self.stub = _WaitForReady(stub)  # type: ignore[assignment]


class _WaitForReady:
    def __init__(self, stub: object) -> None:
        self._stub = stub

    def __getattr__(self, name: str) -> object:
        method = getattr(self._stub, name)
        return lambda request, **kw: method(request, wait_for_ready=True, **kw)


TOPIC, GROUP = "faults", "g"


@dataclass
class Errors:
    """Client-visible failures: (monotonic time, operation, what)."""

    events: list[tuple[float, str, str]] = field(default_factory=list)

    def add(self, op: str, what: str) -> None:
        self.events.append((time.monotonic(), op, what))

    def count(self, op: str) -> int:
        return sum(1 for _, o, _ in self.events if o == op)


class Load:
    def __init__(self, endpoint: str, *, consumers: int = 3, batch: int = 5) -> None:
        self.endpoint = endpoint
        self.batch = batch
        self.stop_producing = threading.Event()
        self.stop_consuming = threading.Event()
        self.lock = threading.Lock()
        self.acked: set[bytes] = set()  # bodies the proxy acknowledged (SendMessage OK)
        self.consumed: Counter[bytes] = Counter()  # body → times delivered to some consumer
        self.errors = Errors()
        self.sends = 0
        self.receives = 0
        self.progress = threading.Condition(self.lock)
        self.threads = [threading.Thread(target=self._produce, name="producer", daemon=True)]
        self.threads += [
            threading.Thread(target=self._consume, name=f"consumer{i}", daemon=True) for i in range(consumers)
        ]

    def start(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def _produce(self) -> None:
        client, n = Client(self.endpoint), 0
        try:
            while not self.stop_producing.is_set():
                bodies = [f"m{n + i}".encode() for i in range(self.batch)]
                n += self.batch
                try:
                    reply = client.send(TOPIC, bodies, timeout_s=5)
                    code = reply.status.code
                except grpc.RpcError as exc:
                    code = -1
                    what = exc.code().name  # type: ignore[attr-defined]
                with self.lock:
                    self.sends += 1
                    if code == v2.OK:
                        self.acked.update(bodies)
                    else:
                        self.errors.add("send", what if code == -1 else v2.Code.Name(code))
                self.stop_producing.wait(
                    0.01 if code == v2.OK else ERROR_PAUSE_S
                )  # pacing: ~300 messages/s, the cores are shared
        finally:
            client.close()

    def _consume(self) -> None:
        client = Client(self.endpoint)
        try:
            while not self.stop_consuming.is_set():
                try:
                    status, messages = client.receive(TOPIC, GROUP, invisible_s=2, poll_s=1)
                except grpc.RpcError as exc:
                    with self.lock:
                        self.errors.add("receive", exc.code().name)  # type: ignore[attr-defined]
                    self.stop_consuming.wait(ERROR_PAUSE_S)
                    continue
                with self.lock:
                    self.receives += 1
                    self.consumed.update(m.body for m in messages)
                    if status.code not in (v2.OK, v2.MESSAGE_NOT_FOUND):
                        self.errors.add("receive", v2.Code.Name(status.code))
                    self.progress.notify_all()
                if not messages:
                    continue
                try:
                    code = client.ack(TOPIC, GROUP, messages).status.code
                except grpc.RpcError as exc:
                    with self.lock:
                        self.errors.add("ack", exc.code().name)  # type: ignore[attr-defined]
                    continue
                if code != v2.OK:  # the message comes back after its invisible time: a duplicate, not a loss
                    with self.lock:
                        self.errors.add("ack", v2.Code.Name(code))
        finally:
            client.close()

    def wait_consumed(self, predicate: object, timeout_s: float) -> bool:
        """Wait (bounded) until predicate(self) holds, re-checked on every receive."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while not predicate(self):  # type: ignore[operator]
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.progress.wait(left)
            return True

    def close(self, timeout_s: float = 10.0) -> None:
        self.stop_producing.set()
        self.stop_consuming.set()
        for thread in self.threads:
            thread.join(timeout_s)
