"""The v2 byte path's costs per message, in-process (no sockets): what a broker's Pop spends building its answer
with and without `v2`, what its send path spends on `Message.v2_system`, and what the proxy spends on a v2
ReceiveMessage frame as an object (`to_client`, then grpc's serialization) or as spliced bytes.

    .venv/bin/python -m bench.v2_splice [--repeat 11]

32 messages of 256 B with a tag, a key and a 30-character id; best of `--repeat` timings (a shared host only
adds). docs/BROKER.md, "Pop answers for the v2 byte path", cites it. Not a test.
"""

from __future__ import annotations

import argparse
import os
import timeit
from collections.abc import Callable

from popgate_pb import broker_pb2 as pb

from broker.model import Popped
from popgate_contract.v2wire import static_system
from proxy.v2.receive import V2

BATCH = 32


def _popped(payload: bytes) -> list[Popped]:
    return [
        Popped("bench", 1, 1000 + i, 1_764_000_000_456, payload, 1, f"1~b1~bench~1~{1000 + i}~1~abcdef~1", 1)
        for i in range(BATCH)
    ]


def _pop(popped: list[Popped], *, v2: bool | None) -> bytes:
    """`broker.handlers.pop`'s loop (v2 None: the code before `v2_system`)."""
    out = pb.PopResponse()
    add = out.messages.add
    for p in popped:
        entry = add(receipt_handle=p.handle, delivery_attempt=p.attempt, invisible_until_ms=p.invisible_until_ms)
        stored = entry.stored
        message = stored.message
        message.MergeFromString(p.payload)
        if v2 is False:
            message.ClearField("v2_system")
        stored.queue_id = p.queue_id
        stored.offset = p.offset
        stored.store_ms = p.store_ms
    return out.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=11)
    args = parser.parse_args()
    message = pb.Message(
        topic="bench",
        message_id="0A0B0C0D0E0F101112131415161718",
        body=os.urandom(256),
        tag="t",
        keys=["k1"],
        born_ms=1_764_000_000_123,
        born_host="host-1",
    )
    before = message.SerializeToString()
    message.v2_system = static_system(message)
    after = message.SerializeToString()
    old, new = _popped(before), _popped(after)
    plain = pb.PopResponse.FromString(_pop(old, v2=None)).messages
    spliced = pb.PopResponse.FromString(_pop(new, v2=True)).messages

    def frames(answer: object) -> Callable[[], object]:
        def run() -> object:
            out = []
            for i in range(BATCH):
                frame = V2.frame(answer, range(i, i + 1), False, "")  # type: ignore[arg-type]
                out.append(frame if isinstance(frame, bytes) else frame.SerializeToString())
            return out

        return run

    rows: list[tuple[str, Callable[[], object], int]] = [
        ("broker Pop answer, before v2_system", lambda: _pop(old, v2=None), BATCH),
        ("broker Pop answer, without v2 (cleared)", lambda: _pop(new, v2=False), BATCH),
        ("broker Pop answer, with v2", lambda: _pop(new, v2=True), BATCH),
        ("broker send: static_system", lambda: static_system(message), 1),
        ("proxy v2 frame: to_client + serialize", frames(plain), BATCH),
        ("proxy v2 frame: spliced bytes", frames(spliced), BATCH),
    ]
    print(f"{'per message':44s} {'µs':>6s}")
    for label, run, per in rows:
        number = max(1, 3200 // per)
        best = min(timeit.repeat(run, number=number, repeat=args.repeat)) / number / per
        print(f"{label:44s} {best * 1e6:6.2f}")


if __name__ == "__main__":
    main()
