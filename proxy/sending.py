"""Sends, protocol-neutral: a request's runs routed to brokers (a message group to its own, the rest in rotation),
failed over from a broker down, without the topic or refusing writes, and bounded by the bytes in flight. Part of
`proxy.core.Proxy`, which checks that the proxy is not closing first. Imports no gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence

from google.protobuf.message import Message
from popgate_pb import broker_pb2 as bpb

from popgate_contract import errors
from popgate_process.throttled import Throttled
from proxy.outgoing import Chunk, Run, chunks
from proxy.ports import BrokerClient
from proxy.receive.announce import Announcer
from proxy.routing import BrokerPool, SlowSends, TopicMisses

log = logging.getLogger(__name__)

SEND_OVERHEAD = 1024  # bytes counted per message beyond its body (envelope, coroutine, result)


class PartlyStored(Exception):
    """A send whose message groups went to brokers apart, some stored and some not: `error` is the first
    failure, `results` one per message (None: not stored, or not known to be)."""

    def __init__(self, error: errors.DomainError, results: list[bpb.SendResult | None]) -> None:
        super().__init__(error.message)
        self.error = error
        self.results = results


class Sender:
    def __init__(
        self,
        pool: BrokerPool,
        announcer: Announcer,
        timeout_until: Callable[[float | None], float],
        *,
        chunk_bytes: int,
        max_bytes: int,
    ) -> None:
        """announcer: a broker that came up is sent to last while the proxy's groups are announced to it;
        timeout_until(deadline): a broker call's time for a client's deadline (loop time, or None)."""
        self.pool = pool
        self._announcer = announcer
        self._timeout_until = timeout_until
        self._chunk_bytes = chunk_bytes
        self._max_bytes = max_bytes
        self.in_flight_bytes = 0  # of sends waiting for brokers (bodies + SEND_OVERHEAD each): bounded
        self.inflating_bytes = 0  # of GZIP requests waiting to inflate or inflating (`holding`), in the same bound
        self._topic_misses = TopicMisses()
        self.slow = SlowSends()  # brokers whose sends time out in a row: tried last (proxy.routing)
        self._full_s = timeout_until(None)  # a broker call's own time, uncut by a client's deadline
        self._failover_logs: dict[tuple[str, str], Throttled] = {}  # by broker and error: a few each
        self._slow_logs: dict[tuple[str, bool], Throttled] = {}  # by broker, put last or back: a few each

    async def send_runs(
        self, runs: Sequence[Run], deadline: float | None, *, admitted: bool = False
    ) -> list[bpb.SendResult]:
        """Store the runs' messages; results in request order. Messages of one message group go to one broker.
        `deadline`: the client's (loop time), when it has one. `admitted`: a GZIP request the bound let in before it
        inflated, checked now against the sends at brokers alone, not against the requests waiting behind it —
        test_overload.py::test_a_gzip_request_let_in_is_not_refused_after_inflating_for_those_behind_it."""
        cost = self.check_bytes(sum(r.held_bytes for r in runs), sum(len(r.ids) for r in runs), admitted=admitted)
        self.in_flight_bytes += cost
        try:
            return await self._send(runs, deadline)
        finally:
            self.in_flight_bytes -= cost

    @contextlib.contextmanager
    def holding(self, cost: int) -> Iterator[None]:
        """`cost` (what `check_bytes` answered) counted as in flight meanwhile: a GZIP request waiting for its turn
        to inflate, and inflating, holds its compressed bodies — test_overload.py::
        test_gzip_requests_waiting_to_inflate_count_against_max_send_bytes."""
        self.inflating_bytes += cost
        try:
            yield
        finally:
            self.inflating_bytes -= cost

    def broker_up(self, broker: str) -> None:
        """`broker` came up (a restart may have cured sends that timed out there in a row): back in the rotation."""
        if self.slow.forget(broker):
            log.info("broker %s is up again: back in the send rotation", broker)

    def check_room(self, messages: Sequence[Message]) -> int:
        """The cost of sending ``messages`` (protobuf messages: each encoded whole, keys and properties with its
        body, + SEND_OVERHEAD); TooManyRequests when it would pass max_send_bytes (one request alone always fits).
        The edge asks before it converts a request, so a refused one costs no copy of its bodies —
        tests/unit/proxy/test_overload.py::test_sends_count_their_keys_and_properties_not_their_bodies_alone."""
        return self.check_bytes(sum(m.ByteSize() for m in messages), len(messages))

    def check_bytes(self, held_bytes: int, count: int, *, admitted: bool = False) -> int:
        """`check_room` of `count` messages that take `held_bytes` (`admitted`: see `send_runs`)."""
        cost = held_bytes + SEND_OVERHEAD * count
        held = self.in_flight_bytes if admitted else self.in_flight_bytes + self.inflating_bytes
        if held and held + cost > self._max_bytes:
            raise errors.TooManyRequests(f"the proxy already has {held} bytes of sends in flight")
        return cost

    def _batches(self, runs: Sequence[Run]) -> tuple[list[tuple[str | None, list[tuple[int, Run]]]], int]:
        """The runs (each with its first message's place in the request) by the broker Sends they go in, each with
        a message group that routes it (None: the send rotation), and the request's message count.

        Message groups whose brokers come in the same order share a Send (the broker puts each message in its
        group's queue, and a fail-over moves them all alike): a request of many groups is a Send per broker, not
        one per group — test_core.py::test_a_requests_message_groups_share_a_send_per_broker."""
        groups: dict[str | None, list[tuple[int, Run]]] = {}
        count = 0
        for run in runs:
            groups.setdefault(run.group or None, []).append((count, run))
            count += len(run.ids)
        if len(groups) - (None in groups) <= 1:  # one message group at most: its order is the send's own
            return list(groups.items()), count
        batches: dict[tuple[str, ...] | None, tuple[str | None, list[tuple[int, Run]]]] = {}
        for key, placed in groups.items():
            where = None if key is None else tuple(self.pool.order(key))
            batch = batches.get(where)
            if batch is None:
                batches[where] = (key, placed)
            else:
                batch[1].extend(placed)
        for _, placed in batches.values():
            placed.sort(key=lambda start_run: start_run[0])  # in the request's order
        return list(batches.values()), count

    async def _send(self, runs: Sequence[Run], deadline: float | None) -> list[bpb.SendResult]:
        batches, count = self._batches(runs)
        results: list[bpb.SendResult | None] = [None] * count

        async def one(key: str | None, placed: list[tuple[int, Run]]) -> None:
            for chunk in chunks(placed, self._chunk_bytes):
                stored = await self._with_failover(key, chunk, deadline)
                if len(stored) != len(chunk.places):
                    raise errors.BrokerFailure(f"broker stored {len(stored)} of {len(chunk.places)} messages")
                for i, result in zip(chunk.places, stored, strict=True):
                    results[i] = result

        # Every group settles before the answer (a client retrying must not race a store still in flight, and
        # the request's bytes stay counted until then); the first error reaches the client as itself.
        if len(batches) == 1:  # awaited in place: a task per batch only where there are several
            [(key, placed)] = batches
            try:
                await one(key, placed)
                outcomes: list[BaseException | None] = [None]
            except Exception as exc:
                outcomes = [exc]
        else:
            outcomes = await asyncio.gather(*(one(key, placed) for key, placed in batches), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                if isinstance(outcome, errors.DomainError) and any(r is not None for r in results):
                    raise PartlyStored(outcome, results)
                raise outcome
        return [r for r in results if r is not None]

    async def _with_failover(self, key: str | None, chunk: Chunk, deadline: float | None) -> Sequence[bpb.SendResult]:
        last: errors.DomainError = errors.BrokerUnavailable("no broker is configured")
        topic = chunk.topic
        candidates = self._order(key)
        tried = missing = 0
        deleting: errors.TopicNotFound | None = None
        unstored: errors.StoreUnavailable | None = None  # a broker that took the send and could not store it
        for client in candidates if topic is None else self._topic_misses.last(topic, candidates):
            tried += 1
            timeout_s, started = self._timeout_until(deadline), self.slow.generation
            try:
                stored = await client.send(chunk, timeout_s=timeout_s)
            except errors.BrokerTimeout:  # not failed over: it may have been stored
                # Counted against the broker only when it had its whole time, not a client's short deadline —
                # test_slow_sends.py::test_a_timeout_cut_short_by_a_clients_deadline_is_not_the_brokers.
                if timeout_s >= self._full_s:
                    self._timed_out(client.name)
                raise
            # Down, without this topic, or its store refusing writes (a full disk: the commit stored nothing) —
            # test_core.py::test_send_fails_over_from_a_broker_whose_store_refuses_writes.
            except (errors.BrokerUnavailable, errors.TopicNotFound, errors.StoreUnavailable) as exc:
                self._failover_log(client.name, exc)
                if isinstance(exc, errors.TopicNotFound):
                    missing += 1
                    if topic is not None:
                        self._topic_misses.missed(topic, client.name)
                    if (
                        errors.BEING_DELETED in exc.message
                    ):  # the reason to give (a broker that makes topics refuses only so)
                        deleting = exc
                elif isinstance(exc, errors.StoreUnavailable):
                    unstored = exc
                last = exc
            else:
                if self.slow.answered(client.name, started):
                    self._slow_log(client.name, False)(
                        "broker %s stored a send again: back in the send rotation", client.name
                    )
                return stored
        if deleting is not None:  # not "auto-create is off": a broker that creates topics refused it as deleted —
            raise deleting  # tests/unit/proxy/test_core.py::test_a_topic_being_deleted_is_said_so_not_missing
        if unstored is not None and isinstance(last, errors.TopicNotFound):  # not "does not exist": where it does,
            raise unstored  # the store refused it — test_core.py::test_a_send_one_store_refused_is_said_so_not_missing
        if topic is not None and missing > 1 and missing == tried:  # not only the last broker asked lacks it
            raise errors.TopicNotFound(f"topic {topic} exists on none of the {tried} live brokers (auto-create is off)")
        raise last

    def _order(self, key: str | None) -> list[BrokerClient]:
        """The brokers a send tries, in order (`BrokerPool.candidates`). After the other live ones: a broker that came
        up, while its groups are announced (proxy.receive.announce) — tests/integration/proxy/test_group_announce.py::
        test_sends_wait_for_the_announcements_to_a_broker_back_empty; and for a send without a message group, a
        broker whose sends time out in a row (`SlowSends`), but first for the one send that probes it —
        test_slow_sends.py::test_a_broker_whose_sends_time_out_in_a_row_is_sent_to_last_then_probed_then_back. A
        message group keeps its broker even then, its order needing that one broker —
        test_slow_sends.py::test_a_message_group_keeps_its_broker_while_that_broker_is_sent_to_last."""
        if key is not None or not self.slow.last:
            return self._announcer.send_order(self.pool.candidates(key))
        candidates = self.pool.candidates(last=self.slow.last)
        probe = self.slow.probe()
        if probe is not None:
            first = [c for c in candidates if c.name == probe and c.healthy]
            candidates = first + [c for c in candidates if c not in first]
        return self._announcer.send_order(candidates)

    def _timed_out(self, broker: str) -> None:
        if self.slow.timed_out(broker):
            self._slow_log(broker, True)(
                "broker %s: %d sends in a row timed out; sends without a message group try it last until it stores"
                " one again (one send probes it after %g s, then at doubling intervals)",
                broker,
                self.slow.after,
                self.slow.last_s,
            )

    def _slow_log(self, broker: str, last: bool) -> Throttled:
        """The line saying `broker` was put last (WARNING) or is back (INFO), at most every FAILURE_LOG_EVERY_S each
        (a broker at the edge of its capacity may go and come back many times a second)."""
        throttled = self._slow_logs.get((broker, last))
        if throttled is None:
            throttled = self._slow_logs[(broker, last)] = Throttled(log.warning if last else log.info)
        return throttled

    def _failover_log(self, broker: str, exc: errors.DomainError) -> None:
        """A line per broker and reason at most every FAILURE_LOG_EVERY_S, however many sends fail over (each is
        counted in popgate_proxy_broker_rpcs_total by its outcome) — test_core.py::
        test_sends_failing_over_log_a_line_per_broker_and_reason_not_per_send."""
        key = (broker, type(exc).__name__)
        throttled = self._failover_logs.get(key)
        if throttled is None:
            throttled = self._failover_logs[key] = Throttled(log.info)
        throttled("send to broker %s failed over: %s", broker, exc.message)
