"""Clients in a forked child (docs/SDK.md, "Processes, threads and fork"), without sockets: a blocking client's
channel of its own. With a server: tests/integration/sdk/test_fork.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from popgate import Producer, SimpleConsumer


def test_a_forked_childs_first_call_opens_a_channel_of_its_own_and_leaves_the_inherited_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parent = os.getpid()
    with Producer("127.0.0.1:1") as producer, SimpleConsumer("127.0.0.1:1", "g", "t") as consumer:
        inherited = [producer._channel, producer._send_shared, consumer._channel, consumer._stub, consumer._ext]
        closed: list[object] = []
        for channel in (inherited[0], inherited[2]):
            monkeypatch.setattr(channel, "close", lambda channel=channel: closed.append(channel))
        monkeypatch.setattr(os, "getpid", lambda: parent + 1)  # now in the child
        now = [producer._channel, producer._send_shared, consumer._channel, consumer._stub, consumer._ext]
        assert all(a is not b for a, b in zip(inherited, now, strict=True))
        assert producer._channel is now[0] and consumer._stub is now[3]  # once: later calls keep the new one
    assert closed == []  # closing in the child leaves grpc's inherited state alone (it closed the new channels)


# A consumer whose ack thread, started in the parent, waits free for work at the fork; the child acks without waiting
# and closes: what did its ack calls send?
ACKS_AFTER_FORK = """
import os, time
from popgate import Message, SimpleConsumer

acked = []
consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
consumer._ack = lambda plan: acked.extend(e.message_id for r in plan for e in r.entries) or []
consumer.ack(Message(b"x", topic="t", message_id="parent", receipt_handle="rh"), wait=False)
deadline = time.monotonic() + 5
while consumer._unwaited._free == 0 and time.monotonic() < deadline:  # the thread is free once its ack ended
    time.sleep(0.01)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    batch = [Message(b"x", topic="t", message_id=f"child{i}", receipt_handle="rh") for i in range(3)]
    consumer.ack_many(batch, wait=False)  # one ack call
    started = time.monotonic()
    consumer.close()
    os.write(write, f"{' '.join(sorted(acked))} {time.monotonic() - started < 2}".encode())
    os._exit(0)
os.close(write)
print(os.read(read, 4096).decode())
os.waitpid(pid, 0)
"""


def printed_by(script: str) -> list[str]:
    """The words `script` prints, run in a process of its own (it forks: not in the test's process)."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.split()


def test_a_forked_childs_unwaited_acks_are_sent() -> None:
    assert printed_by(ACKS_AFTER_FORK) == [
        "child0",
        "child1",
        "child2",
        "parent",
        "True",
    ]  # sent at once, close() quick


HELD_AFTER_FORK = """
import os
from popgate import Message
from popgate._unyielded import Unyielded

held = Unyielded()
key = held.start([Message(b"", message_id=f"m{i}") for i in range(3)])  # a parent thread's batch, mid-iteration
assert held.next(key).message_id == "m0"
pid = os.fork()
if pid == 0:
    print("child", len(held.take_all()), flush=True)  # what its close() would give back
    os._exit(0)
os.waitpid(pid, 0)
print("parent", held.next(key).message_id, flush=True)
"""


def test_a_forked_childs_close_gives_back_nothing_its_parent_holds() -> None:
    assert printed_by(HELD_AFTER_FORK) == ["child", "0", "parent", "m1"]


# A producer made in the parent; what client id does each process's call carry?
CLIENT_ID_AFTER_FORK = """
import os
from popgate import Producer

def client_id(producer):
    return dict(producer._metadata())["x-mq-client-id"]

producer = Producer("127.0.0.1:1")
before = client_id(producer)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(write, f"{client_id(producer)} {os.getpid()}".encode())
    os._exit(0)
os.close(write)
child_id, child_pid = os.read(read, 4096).decode().split()
os.waitpid(pid, 0)
print(before == client_id(producer), child_id != before, child_id.split("@")[1] == child_pid)
"""


def test_a_forked_childs_calls_carry_a_client_id_of_its_own() -> None:
    assert printed_by(CLIENT_ID_AFTER_FORK) == ["True", "True", "True"]


# A consumer whose close() another thread of the parent had begun at the fork; can the child close it?
CLOSE_AFTER_FORK_DURING_CLOSE = """
import os
from popgate import SimpleConsumer

consumer = SimpleConsumer("127.0.0.1:1", "g", "t")
consumer.__dict__["_closer"] = (os.getpid(), 1)  # as another thread's close() records itself
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    consumer.close()
    os.write(write, str(consumer._closed_fully.is_set()).encode())  # its own close() ended its channel
    os._exit(0)
os.close(write)
print(os.read(read, 64).decode())
os.waitpid(pid, 0)
"""


def test_a_child_forked_during_close_can_close() -> None:
    assert printed_by(CLOSE_AFTER_FORK_DURING_CLOSE) == ["True"]
