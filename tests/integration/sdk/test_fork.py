"""Clients in forked processes (docs/SDK.md, "Processes, threads and fork"), each case in a subprocess of its own:
a child's blocking calls on clients it inherited, and asyncio clients in the child of a parent that used them."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Threads of the parent keep calling shared clients while it forks children that each send, receive and ack.
BUSY_PARENT = """
import faulthandler, os, select, sys, threading, time
from popgate import Producer, SimpleConsumer

endpoint, topic, group = sys.argv[1:4]
producer = Producer(endpoint)
consumer = SimpleConsumer(endpoint, group, {topic: "*"}, wait=2, invisible=30)
stop = threading.Event()

def send() -> None:
    while not stop.is_set():
        producer.send_many(topic, [b"bg"] * 8)

def receive() -> None:
    while not stop.is_set():
        if batch := consumer.receive(max=8):
            consumer.ack_many(batch, wait=False)

threads = [threading.Thread(target=send) for _ in range(3)] + [threading.Thread(target=receive) for _ in range(2)]
for thread in threads:
    thread.start()
time.sleep(0.3)
for _ in range(12):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        faulthandler.dump_traceback_later(8, exit=True)  # a hung child's stack, on stderr
        try:
            producer.send(topic, b"child")
            consumer.ack_many(consumer.receive(max=4, wait=1))
            os.write(write, b"ok")
        except BaseException as exc:
            os.write(write, f"{type(exc).__name__}:{exc}".replace(" ", "_").encode())
        os._exit(0)
    os.close(write)
    answered, _, _ = select.select([read], [], [], 10)
    print(os.read(read, 64).decode() if answered else "hung", flush=True)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    os.close(read)
stop.set()
for thread in threads:
    thread.join(10)
consumer.close()
producer.close()
"""


# An application's process as grpc starts it by default: without the fork support and I/O engine choices popgate's
# own programs make (proto/popgate_process/grpc_engine.py), which this test process inherited.
APP_ENV = {k: v for k, v in os.environ.items() if k not in ("GRPC_ENABLE_FORK_SUPPORT", "GRPC_EXPERIMENTS")}


def run(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=APP_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_children_forked_while_parent_threads_are_mid_call_use_the_inherited_clients(endpoint: str) -> None:
    # A child's calls wait on no call of the parent's threads. grpc itself skips its fork handlers when threads are
    # in calls at the fork (docs/SDK.md, "Processes, threads and fork"), which can still leave a rare child's call
    # unanswered: one of the twelve is let off.
    topic, group = f"fork-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    done = run(BUSY_PARENT, endpoint, topic, group)
    assert done.stdout.split().count("ok") >= 11, done.stdout + done.stderr


# The parent sends with popgate.aio, then forks; the child makes a new asyncio Producer and sends.
AIO_AFTER_FORK = """
import asyncio, os, select, sys, time
from popgate import RetryPolicy, aio

endpoint, topic = sys.argv[1:3]

async def send() -> None:
    async with aio.Producer(endpoint, request_timeout=1, retry=RetryPolicy(max_attempts=2)) as producer:
        await producer.send(topic, b"x")

asyncio.run(send())
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    started = time.monotonic()
    try:
        asyncio.run(send())
        outcome = "sent"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    os.write(write, f"{time.monotonic() - started:.1f}|{outcome}".encode())
    os._exit(0)
os.close(write)
answered, _, _ = select.select([read], [], [], 20)
print(os.read(read, 4096).decode() if answered else "20|hung")
os.kill(pid, 9)
os.waitpid(pid, 0)
"""


def test_asyncio_clients_in_the_child_of_a_parent_that_used_them_say_so(endpoint: str) -> None:
    _, outcome = run(AIO_AFTER_FORK, endpoint, f"fork-{uuid.uuid4().hex[:8]}").stdout.strip().split("|", 1)
    # said at the first call, not a Timeout after the call's retries (nor no answer at all, as before)
    assert outcome.startswith("RuntimeError: popgate.aio cannot be used in this process: it was forked"), outcome
    assert "'spawn'" in outcome
