"""Configuration and request planning shared by the sync and asyncio clients (no I/O here)."""

from __future__ import annotations

import functools
import itertools
import logging
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack, cast

import grpc
from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import service_pb2 as pb

from . import _nacks, _wire, errors
from ._durations import duration
from ._ids import MessageIds
from ._served import Served
from ._transport import make_options
from ._unyielded import Unyielded
from ._wire_send import SendPlan, a_text, an_int, in_a_group, sent_count
from .message import Message, SendReceipt
from .retry import RetryPolicy

if TYPE_CHECKING:
    from .transactions import Checker

log = logging.getLogger(__name__)

SEND_WINDOW = 4  # SendMessage requests in flight for one send_many
# Iteration long-polls at least this long per receive, so an idle consumer never calls ReceiveMessage in a busy
# loop; a held receive still answers as soon as a message comes —
# tests/unit/sdk/test_iteration.py::test_iteration_long_polls_even_when_wait_is_zero.
ITERATION_MIN_WAIT_S = 1.0
# A give-back (received messages nobody will handle, made ready again at once) waits at most this long, or
# request_timeout when shorter: best effort, one attempt, so that closing an iteration or a consumer stays quick.
GIVE_BACK_TIMEOUT_S = 1.0
# A give-back makes at most this many calls at once (all of any receive's, a joined one's too), more in turn within
# its GIVE_BACK_TIMEOUT_S; those left when it is over are not given back —
# tests/unit/sdk/test_give_back_window.py::test_a_give_back_of_many_messages_ends_within_its_second.
GIVE_BACK_IN_FLIGHT = 64
# Receive requests a consumer keeps to send again (one per subscription and receive arguments; all dropped past it).
RECEIVE_REQUESTS_KEPT = 64


def send_window(requests: Sequence[SendPlan]) -> int:
    """SendMessage calls one send_many keeps in flight: one at a time when any message has a message
    group, so that a group's batches are stored in the order given (FIFO within a group)."""
    fifo = any(in_a_group(r) for r in requests)
    return 1 if fifo else SEND_WINDOW


def receipts_so_far(
    requests: Sequence[SendPlan], results: Sequence[list[SendReceipt | None] | None]
) -> list[SendReceipt | None]:
    """One entry per message of `requests`: its receipt where its call's results are in, else None."""
    out: list[SendReceipt | None] = []
    for request, got in zip(requests, results, strict=True):
        out += got if got is not None else [None] * sent_count(request)
    return out


class Options(TypedDict, total=False):
    """`ClientBase`'s keyword arguments, for the clients that add their own."""

    access_key: str | None
    secret_key: str | None
    tls: bool | str | Path
    namespace: str
    request_timeout: float
    retry: RetryPolicy | None


class ClientBase:
    def __init__(
        self,
        endpoint: str,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        tls: bool | str | Path = False,
        namespace: str = "",
        request_timeout: float = 3.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.options = make_options(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            tls=tls,
            namespace=namespace,
            request_timeout=request_timeout,
            retry=retry,
        )
        self._metadata = self.options.metadata()
        self._closed = False
        self._open()

    def _open(self) -> None:
        """Open the connection (the asyncio clients open it lazily, inside the running loop)."""

    @property
    def endpoint(self) -> str:
        """The proxy address this client talks to."""
        return self.options.endpoint

    @property
    def closed(self) -> bool:
        """True once `close` was called (or the context manager exited): an iteration yields no more, and every call
        raises Unavailable once close() has waited for the acks not waited for (at most 10 s) —
        tests/unit/sdk/test_close_interleavings.py::test_an_iteration_yields_nothing_once_close_was_called."""
        return self._closed or self._close_called

    @property
    def _close_called(self) -> bool:
        """Whether close() was called (it marks the client `_closed` once the acks not waited for have ended)."""
        return False

    def _unimplemented(self, exc: grpc.RpcError, served: str, what: str) -> bool:
        """Whether a failed call of popgate's extension says the server has no such RPC (UNIMPLEMENTED: nothing was
        served): the `Served` attribute named `served` turns False, and v2 serves this call and the next ones until
        it is asked again (`Served`)."""
        if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
            return False
        self._not_served(served, "%s serves no %s: using v2", what)
        return True

    def _may_serve(self, served: str) -> bool:
        """Whether the `Served` attribute named `served` is not False, read for planning: a verdict whose minute is
        over is left for the call itself to ask again (`Served.peek`)."""
        verdict: Served = getattr(type(self), served)
        return verdict.peek(self) is not False

    def _not_served(self, served: str, text: str, what: str = "") -> None:
        """Turn the `Served` attribute named `served` False, logging the switch the first time (once a minute
        after, a proxy asked again that still serves none is logged at debug level)."""
        verdict: Served = getattr(type(self), served)
        level = logging.DEBUG if verdict.refused_before(self) else logging.INFO
        log.log(level, text, self.options.endpoint, *((what,) if what else ()))
        setattr(self, served, False)


class ProducerBase(ClientBase):
    _ids = MessageIds()

    def __init__(
        self, endpoint: str, *, checker: Checker | None = None, topics: Sequence[str] = (), **options: Unpack[Options]
    ) -> None:
        if checker is not None and (isinstance(topics, str) or not topics):
            raise ValueError("a checker needs the topics (a list) whose transactions it is asked about: topics=[...]")
        self._checker = checker
        self._topics = tuple(topics)
        # Message ids of this producer's transactions not ended yet, each to its transaction (held weakly).
        self._open_halves: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        super().__init__(endpoint, **options)

    # Whether the proxy takes SharedSends: True once it took one; None, not known yet; False, a proxy older than
    # them or one without popgate's extension, every send then going as SendMessage.
    _shared_served = Served()
    # Whether the proxy's Session takes EndTransaction (popgate.aio): False, one older than it, every end then a call.
    _ends_served = Served()

    def _plan(
        self,
        topic: str,
        items: Iterable[bytes | str | Message],
        *,
        tag: str | None,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
        delay: float | None,
        deliver_at: float | None,
        message_group: str | None,
        priority: int | None = None,
        transactional: bool = False,
        shared: bool = False,
    ) -> Sequence[SendPlan]:
        """The requests of one send_many; `shared`: plain bodies go as SharedSends (for a Session stream)."""
        if not a_text("topic", topic):
            raise ValueError("topic must not be empty")
        if isinstance(items, str | bytes | bytearray | memoryview | Message):  # iterating one would send its parts
            raise TypeError("send_many takes an iterable of bodies or Messages; use send() for one")
        namespace = self.options.namespace
        outgoing = functools.partial(
            _wire.outgoing,
            tag=tag,
            keys=keys,
            properties=properties,
            delay=delay,
            deliver_at=deliver_at,
            message_group=message_group,
            priority=priority,
        )
        bodies = items if isinstance(items, list) else list(items)
        if bodies and all(type(item) is bytes for item in bodies):  # send_many of plain bodies: options checked once
            plain = cast(list[bytes], bodies)
            if shared and not transactional:
                return _wire.shared_sends(topic, plain, outgoing(b""), self._ids, namespace=namespace)
            return _wire.shared_requests(
                topic, plain, outgoing(b""), self._ids, namespace=namespace, transactional=transactional
            )
        messages = [outgoing(item) for item in bodies]
        if not messages:
            return []
        return _wire.send_requests(topic, messages, self._ids, namespace=namespace, transactional=transactional)


def subscriptions_of(subscriptions: Mapping[str, str] | Iterable[str] | str) -> list[_wire.Subscription]:
    """The subscriptions as given: topics (each a non-empty str) and their filters (a str; empty means "*")."""
    if isinstance(subscriptions, bytes | bytearray):
        raise TypeError(f"subscriptions must be a topic, topics or a mapping of topic to filter, got {subscriptions!r}")
    if isinstance(subscriptions, str):
        subs = [_wire.Subscription(subscriptions)]
    elif isinstance(subscriptions, Mapping):
        subs = [_wire.Subscription(t, a_text("filter", e) or "*") for t, e in subscriptions.items()]
    else:
        subs = [_wire.Subscription(t) for t in subscriptions]
    if not subs:
        raise ValueError("subscribe to at least one topic")
    for sub in subs:
        if not a_text("topic", sub.topic):
            raise ValueError("topic must not be empty")
    return subs


def log_give_back_failures(
    log: logging.Logger, answers: Sequence[pb.ChangeInvisibleDurationResponse | BaseException], of: int = 0
) -> None:
    """Log at DEBUG the give-backs of `of` messages (all answered, by default) that failed or were not sent in
    time (those messages come back after ``invisible``, as without one)."""
    failed = [a for a in answers if isinstance(a, BaseException) or a.status.code not in _wire.SUCCESS]
    unsent = max(of - len(answers), 0)
    if failed or unsent:
        first = failed[0] if failed else f"{unsent} not sent within {GIVE_BACK_TIMEOUT_S:g} s"
        log.debug(
            "giving back %d of %d unhandled message(s) failed: %s", len(failed) + unsent, len(answers) + unsent, first
        )


class Answer(list[Any]):
    """A receive's frames so far (either framing), counting its messages against the batch its request asked
    (`most`; 0: no bound). An answer past it (more messages, or more frames bringing them: one each at least) is cut
    at the frame that passes it (the call cancelled, what it brought given back) rather than read on without bound —
    tests/unit/sdk/test_batch_receive.py::test_an_answer_with_more_messages_than_asked_is_cut_and_the_excess_given_back."""

    __slots__ = ("most", "got", "bringing")

    def __init__(self, most: int = 0) -> None:
        super().__init__()
        self.most = most
        self.got = 0  # messages
        self.bringing = 0  # frames of messages

    def over(self, frame: Any) -> bool:
        """Add a frame: whether the answer is now past its batch."""
        self.append(frame)
        kind = frame.WhichOneof("content")
        if kind == "messages":
            self.got += len(frame.messages.messages)
        elif kind != "message":
            return False
        else:
            self.got += 1
        self.bringing += 1
        return 0 < self.most < max(self.got, self.bringing)

    def too_many(self) -> errors.ServerError:
        return errors.ServerError(f"the proxy answered {self.got} messages to a receive of {self.most}")


def deliverable(log: logging.Logger, frames: Sequence[Any]) -> tuple[list[Message], list[Message]]:
    """The messages of a receive's answer to deliver, and those to give back instead (a nack with delay 0: each comes
    again, to the DLQ after the group's max attempts): whose body does not match its digest or does not inflate,
    each logged at WARNING, as RocketMQ's clients do —
    tests/unit/sdk/test_corrupt.py::test_a_corrupt_message_is_given_back_and_the_rest_of_its_batch_delivered."""
    corrupt: list[tuple[Message, str]] = []
    messages = _wire.received(frames, corrupt)
    for message, why in corrupt:
        log.warning("message %s of topic %s not delivered, given back: %s", message.message_id, message.topic, why)
    return messages, [message for message, _ in corrupt]


class ConsumerBase(ClientBase):
    # Whether the proxy serves popgate's ReceiveMessages (many messages per frame): None until the first receive
    # tells; False once a server answered UNIMPLEMENTED (a RocketMQ proxy): v2's ReceiveMessage then (`Served`).
    _batch_receive = Served()
    # Whether the proxy serves popgate's ChangeInvisibleMany (nack_many): None until the first tells; False once it
    # said it has none (an older proxy, a RocketMQ proxy): a ChangeInvisibleDuration per message then (`Served`).
    _many_served = Served()

    def __init__(
        self,
        endpoint: str,
        group: str,
        subscriptions: Mapping[str, str] | Iterable[str] | str,
        *,
        batch: int = 16,
        invisible: float = 30.0,
        wait: float = 20.0,
        **options: Unpack[Options],
    ) -> None:
        # Every argument is checked before the channel opens: a refused one leaves nothing open —
        # tests/unit/sdk/test_retry_loop.py::test_a_consumer_refusing_its_arguments_opens_no_channel.
        if not a_text("group", group):
            raise ValueError("group must not be empty")
        batch = an_int("batch", batch)
        if not 1 <= batch <= 32:
            raise ValueError(f"batch must be 1..32, got {batch}")
        self.group = group
        self.subscriptions = subscriptions_of(subscriptions)
        self.batch = batch
        self.invisible = duration("invisible", invisible, positive=True)
        self.wait = duration("wait", wait)
        super().__init__(endpoint, **options)
        self._rotation = itertools.cycle(self.subscriptions)
        self._unyielded = Unyielded()
        self._receive_requests: dict[tuple[object, ...], pb.ReceiveMessageRequest] = {}

    def _batch_unimplemented(self, exc: grpc.RpcError) -> bool:
        """Whether a failed ReceiveMessages says the server has no such RPC: then v2 serves this receive and the
        next ones (tests/unit/sdk/test_batch_receive.py)."""
        return self._unimplemented(exc, "_batch_receive", "batch receive")

    def _receive_plan(
        self, max: int | None, invisible: float | None, wait: float | None, *, keep: bool = True
    ) -> tuple[pb.ReceiveMessageRequest, float]:
        """The next topic's ReceiveMessage request and its deadline (request_timeout + long polling); kept for the
        next receive with the same arguments unless not `keep` (a wait that is what was left of another)."""
        wait = self.wait if wait is None else wait
        sub = next(self._rotation)
        max = self.batch if max is None else max
        invisible = self.invisible if invisible is None else invisible
        # The same arguments make the same request, which nothing changes once made: built once and sent again. The
        # types are part of the key, so an argument that fails (max=1.0) fails every time —
        # tests/unit/sdk/test_wire.py::test_receive_plans_with_the_same_arguments_share_one_request.
        key = (self.group, sub, max, invisible, wait, type(max), type(invisible), type(wait))
        request = self._receive_requests.get(key)
        if request is None:
            request = _wire.receive_request(
                self.group, sub, max=max, invisible=invisible, wait=wait, namespace=self.options.namespace
            )
            if not keep:
                return request, self.options.request_timeout + wait
            if len(self._receive_requests) >= RECEIVE_REQUESTS_KEPT:
                self._receive_requests.clear()
            self._receive_requests[key] = request
        return request, self.options.request_timeout + wait

    @property
    def _iteration_wait(self) -> float:
        """The long-polling time of each receive of an iteration: ``wait``, at least ITERATION_MIN_WAIT_S."""
        return max(self.wait, ITERATION_MIN_WAIT_S)

    @property
    def _give_back_timeout(self) -> float:
        return min(self.options.request_timeout, GIVE_BACK_TIMEOUT_S)

    def _give_back_request(self, message: Message) -> pb.ChangeInvisibleDurationRequest:
        """A nack with delay 0: ready again at once, delivered with ``attempt + 1``."""
        return _wire.change_invisible_request(self.group, message, 0.0, namespace=self.options.namespace)

    def _gives_back_undelivered(self) -> bool:
        """Whether a give-back of messages no caller saw goes as `_undelivered_requests` (not known that the proxy
        has no ChangeInvisibleMany)."""
        return self._many_served is not False

    def _undelivered_requests(self, messages: list[Message]) -> list[ext.ChangeInvisibleMany]:
        """The give-back of `messages` no caller saw as popgate's ChangeInvisibleMany, one request per topic and
        MAX_SEND_BATCH: ready again at once and not counted as a delivery, each coming again with the attempt it had
        (`undelivered`; a proxy or broker older than it counts them) — tests/unit/sdk/test_give_back_undelivered.py."""
        received = [m for m in messages if m.topic and m.receipt_handle]  # no other could be given back at all
        requests = [p.next_request() for p in _nacks.plan(self.group, received, 0.0, namespace=self.options.namespace)]
        for request in requests:
            request.undelivered = True
        return requests

    def _ack_plan(self, messages: Iterable[Message]) -> list[pb.AckMessageRequest]:
        """The AckMessage calls of `messages`; a message never received is a ValueError here, at the call, waiting or
        not (`_wire.received_chunks`)."""
        namespace = self.options.namespace
        chunks = _wire.received_chunks(messages, "acked")
        return [_wire.ack_request(self.group, topic, chunk, namespace=namespace) for topic, chunk in chunks]
