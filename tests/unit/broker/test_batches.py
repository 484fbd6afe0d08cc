"""Batch rows: what goes in comes back per offset; gaps and queue changes start a new row."""

from __future__ import annotations

from collections.abc import Iterator

from broker.batches import BATCH_MESSAGES, Batches, PayloadEnds, batch_rows, unpack
from broker.store import NewMessage


def test_a_group_commit_becomes_one_row_per_queue_of_at_most_batch_messages() -> None:
    batches = Batches()
    for offset in range(BATCH_MESSAGES + 3):
        batches.add(NewMessage("t", 0, 7, "a" if offset % 2 else None, b"m%d" % offset), offset)
    batches.add(NewMessage("t", 1, 8, "b", b"other"), 0)
    rows = batches.all_rows()
    assert [(r[1], r[2]) for r in rows] == [(0, 0), (0, BATCH_MESSAGES), (1, 0)]
    back = [m for r in rows for m in unpack(*r[2:])]
    assert back[:2] == [(0, 7, None, b"m0"), (1, 7, "a", b"m1")]
    assert len(back) == BATCH_MESSAGES + 4
    assert unpack(*rows[1][2:], wanted={BATCH_MESSAGES + 1}) == [
        (BATCH_MESSAGES + 1, 7, "a", b"m%d" % (BATCH_MESSAGES + 1))
    ]


def test_rows_of_the_first_layout_are_batched_with_gaps_kept() -> None:
    old = [("t", 0, o, 1_000 + o, None, b"%d" % o) for o in [*range(100), *range(150, 5_000)]]
    chunks = list(batch_rows(old))
    rows = [r for chunk in chunks for r in chunk]
    assert all(len(chunk) <= 64 for chunk in chunks)
    assert rows[0][2] == 0 and rows[1][2] == 150  # the gap 100..149 starts a new row
    back = [(o, ms, payload) for r in rows for o, ms, _, payload in unpack(*r[2:])]
    assert back == [(o, ms, p) for _, _, o, ms, _, p in old]


def test_payloads_picked_from_a_row_are_those_unpack_gives() -> None:
    """Rows of the same sizes share their remembered ends; a row whose meta differs (other sizes) gets its own."""
    ends = PayloadEnds(max_rows=2)
    for sizes in ([3, 1, 4, 1, 5], [2, 7, 1, 8, 2], [3, 1, 4, 1, 5], [9], [2, 7, 1, 8, 2]):
        batches = Batches()
        for i, size in enumerate(sizes):
            batches.add(NewMessage("t", 0, 7, None, bytes([65 + i]) * size), 10 + i)
        (row,) = batches.all_rows()
        out: dict[tuple[int, int], bytes] = {}
        ends.pick(row[2], row[3], row[4], [9, 10, 12, 14, 15], 3, out)
        assert out == {(3, o): payload for o, _, _, payload in unpack(*row[2:], wanted={9, 10, 12, 14, 15})}


def test_migrating_rows_of_many_queues_holds_a_few_dozen_batches_at_a_time() -> None:
    """Each queue's last batch is emitted once the next queue's rows begin: messages read but not yet in an emitted
    row stay within the chunk's bound however many queues the store has."""
    queues, per_queue = 3_000, 8
    read = 0

    def old_rows() -> Iterator[tuple[str, int, int, int, str | None, bytes]]:
        nonlocal read
        for q in range(queues):
            for o in range(per_queue):
                read += 1
                yield f"t{q // 8}", q % 8, o, 1_000, None, b"x"

    emitted, held = 0, 0
    for chunk in batch_rows(old_rows()):
        held = max(held, read - emitted)
        emitted += sum(len(unpack(*r[2:])) for r in chunk)
    assert emitted == queues * per_queue
    assert held <= 65 * BATCH_MESSAGES
