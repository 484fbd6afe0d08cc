"""The requests of one Session stream waiting for their answers (sans-IO): ids, answers routed to their callers,
joined requests' answers shared out among their parts (sdk/_joining.py), and messages nobody waits for any more
handed to be given back. `sdk/_session.py` does the stream's I/O around it."""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract.session_headers import MAX_PENDING_REQUESTS

from . import _joining, errors
from ._base import Answer
from ._joining import Part

log = logging.getLogger(__name__)

RESPONSES: dict[str, Callable[..., Any]] = {
    "send": pb.SendMessageResponse,
    "send_shared": pb.SendMessageResponse,
    "receive": ext.ReceiveMessagesResponse,
    "ack": pb.AckMessageResponse,
    "change_invisible": pb.ChangeInvisibleDurationResponse,
    "end_transaction": pb.EndTransactionResponse,
    "change_invisible_many": ext.ChangeInvisibleManyResponse,
}
ANSWERS = {"send_shared": "send"}  # a kind answered in another kind's field (SessionResponse's `body`)
# Kinds newer than the Session itself: a proxy older than one answers it as a request without a body (a bare
# BAD_REQUEST), which means "not served", not that request's refusal — tests/unit/sdk/test_session.py::
# test_a_bare_bad_request_to_a_newer_kind_is_kind_unknown.
NEWER_KINDS = frozenset({"send_shared", "end_transaction", "change_invisible_many"})


class KindUnknown(errors.PopgateError):
    """The proxy's Session does not know this request's kind (a proxy older than it): nothing was served."""


class Waiting:
    """The requests of one stream waiting for their answers, by id (sans-IO).

    A receive's answer is its frames up to the status frame that ends it. Messages of an answer nobody waits for
    any more (cancelled, timed out, the stream lost before its status) go to `orphaned`, which gives them back; so
    do those of a dropped request still on their way, up to its batch. Messages under an id this stream never issued
    (or already had the whole answer to) were never this client's to give back: dropped and logged —
    tests/unit/sdk/test_session.py::test_frames_of_an_id_never_issued_are_dropped_and_logged_once. An answer past
    its request's batch (a joined receive's: the parts' batches added up) is cut: its callers get a ServerError,
    what it brought is given back and the request is cancelled at the proxy (`cancel`) —
    tests/unit/sdk/test_session.py::test_an_answer_past_its_batch_is_cut_given_back_and_cancelled.
    """

    def __init__(
        self,
        orphaned: Callable[[list[v2.Message]], None] | None = None,
        cancel: Callable[[int], None] | None = None,
    ) -> None:
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[str, asyncio.Future[Any], Answer]] = {}
        self._orphaned = orphaned
        self._cancel = cancel
        # The receives dropped before their answer ended: the messages each may still bring (frames on their way);
        # the latest MAX_PENDING_REQUESTS kept (the proxy's bound on pending requests).
        self._dropped: dict[int, int] = {}
        self._strays = 0  # messages frames under ids this stream never issued
        self._joined: dict[int, list[Part]] = {}  # a joined request's id: its parts, each waiting under its own id
        self._part_of: dict[int, int] = {}  # a part's id: the joined request it went in
        self._joined_frames: dict[int, Answer] = {}  # a joined receive's id: its frames so far

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: int) -> bool:
        return request_id in self._waiting

    def join(self, parts: list[Part]) -> int:
        """The id of a request joining `parts` (each still answered under its own id)."""
        joined_id = next(self._ids)
        self._joined[joined_id] = parts
        for p in parts:
            self._part_of[p.request_id] = joined_id
        return joined_id

    def to_cancel(self, request_id: int) -> int | None:
        """The request to cancel at the proxy now that `request_id` is dropped: itself, or the joined request it
        went in once none of that request's parts is waiting any more (None until then)."""
        joined_id = self._part_of.pop(request_id, None)
        if joined_id is None:
            return request_id
        parts = self._joined.get(joined_id, ())
        if any(p.request_id in self._waiting for p in parts):
            return None
        self._joined.pop(joined_id, None)
        frames = self._joined_frames.pop(joined_id, None)
        if frames is not None:
            self._orphan(frames)
        if parts and parts[0].kind == "receive":
            self._dropped_with(joined_id, sum(p.count for p in parts) - (frames.got if frames else 0))
        return joined_id

    def add(self, kind: str, future: asyncio.Future[Any], most: int = 0) -> int:
        """The id of a request of `kind` (a receive of `most` messages at most; 0: no bound) whose answer goes to
        `future`."""
        request_id = next(self._ids)
        self._waiting[request_id] = (kind, future, Answer(most))
        return request_id

    def answer(self, response: ext.SessionResponse) -> list[Part]:
        """Route one frame of the stream: the answer (or the next frame of the answer) of its request. Returns the
        parts of a joined request refused as a whole, to send again one by one (`_joining.refused_whole`)."""
        body = response.WhichOneof("body")
        parts = self._joined.pop(response.id, None)
        if parts is not None:
            if parts[0].kind == "receive":
                self._answer_joined_receive(response, body, parts)
                return []
            return self._answer_joined(response, body, parts)
        entry = self._waiting.get(response.id)
        if entry is None:
            if body == "receive" and response.receive.WhichOneof("content") == "messages":
                self._late(response.id, response.receive)
            else:
                self._dropped.pop(response.id, None)  # its answer ended
            return []
        kind, future, frames = entry
        if body == "status" and kind in NEWER_KINDS and response.status.code == v2.BAD_REQUEST:
            # Refused as a request without a body: a proxy that does not know the kind (popgate's own answer any
            # request of a kind it knows in its kind's field) — the caller sends it again as the v2 request.
            del self._waiting[response.id]
            if not future.done():
                future.set_exception(KindUnknown(f"session: {response.status.message}"))
            return []
        if body == "status":  # refused before the proxy knew its kind: the kind's answer with that status
            answer = RESPONSES[kind](status=response.status)
        elif body == ANSWERS.get(kind, kind):
            answer = getattr(response, body)
        else:  # an answer of another kind (or none): the proxy's mistake, this request's error alone
            self.drop(response.id)
            if not future.done():
                future.set_exception(errors.ServerError(f"session: a {body} answer to a {kind} request"))
            return []
        if kind == "receive":
            if answer.WhichOneof("content") != "status":
                if frames.over(answer):
                    del self._waiting[response.id]
                    self._cut(response.id, frames, [future])
                return []
            frames.append(answer)
            answer = frames
        del self._waiting[response.id]
        if not future.done():
            future.set_result(answer)
        elif kind == "receive":  # its caller was cancelled before it could drop it: nobody gets these messages
            self._orphan(frames)
        return []

    def _answer_joined(self, response: ext.SessionResponse, body: str | None, parts: list[Part]) -> list[Part]:
        kind = parts[0].kind
        for p in parts:
            self._part_of.pop(p.request_id, None)
        live = [p for p in parts if p.request_id in self._waiting]
        if body == "status":
            answer = RESPONSES[kind](status=response.status)
        elif body == ANSWERS.get(kind, kind):
            answer = getattr(response, body)
        else:  # an answer of another kind (or none): the proxy's mistake, this request's error
            error = errors.ServerError(f"session: a {body} answer to a {kind} request")
            for p in live:
                future = self._waiting.pop(p.request_id)[1]
                if not future.done():
                    future.set_exception(copy.copy(error))
            return []
        if _joining.refused_whole(answer, parts):
            return live
        for p, mine in zip(parts, _joining.split(answer, [p.count for p in parts]), strict=True):
            entry = self._waiting.pop(p.request_id, None)
            if entry is not None and not entry[1].done():
                entry[1].set_result(mine)
        return []

    def _answer_joined_receive(self, response: ext.SessionResponse, body: str | None, parts: list[Part]) -> None:
        """One frame of a joined receive's answer; at its status, each part waiting gets its share
        (`_joining.split_received`) and what no part waits for is given back."""
        if body == "receive":
            frame = response.receive
        elif body == "status":
            frame = ext.ReceiveMessagesResponse(status=response.status)
        else:
            frame = ext.ReceiveMessagesResponse(
                status=v2.Status(code=v2.INTERNAL_SERVER_ERROR, message=f"session: a {body} answer to a receive")
            )
        frames = self._joined_frames.get(response.id)
        if frames is None:
            frames = self._joined_frames[response.id] = Answer(sum(p.count for p in parts))
        if frame.WhichOneof("content") != "status":
            if not frames.over(frame):
                self._joined[response.id] = parts  # more frames to come
                return
            del self._joined_frames[response.id]
            for p in parts:
                self._part_of.pop(p.request_id, None)
            callers = [self._waiting.pop(p.request_id)[1] for p in parts if p.request_id in self._waiting]
            self._cut(response.id, frames, callers)
            return
        frames.append(frame)
        del self._joined_frames[response.id]
        for p in parts:
            self._part_of.pop(p.request_id, None)
        # A caller cancelled whose future is already done gets nothing: its share goes to those still waiting.
        live = [p for p in parts if p.request_id in self._waiting and not self._waiting[p.request_id][1].done()]
        answers, left = _joining.split_received(frames, [p.count for p in live])
        self._orphan([_joining.Share.of(left)] if left else [])
        for p, mine in zip(live, answers, strict=True):
            self._waiting.pop(p.request_id)[1].set_result(mine)

    def kind_of(self, request_id: int) -> str | None:
        entry = self._waiting.get(request_id)
        return entry[0] if entry is not None else None

    def fail(self, request_id: int, error: BaseException) -> None:
        """Fail one request never sent (its caller gets `error`)."""
        entry = self._waiting.pop(request_id, None)
        if entry is not None and not entry[1].done():
            entry[1].set_exception(error)

    def drop(self, request_id: int) -> bool:
        """Stop waiting for a request (cancelled, timed out); its frames so far are orphaned. Whether it waited."""
        entry = self._waiting.pop(request_id, None)
        if entry is None:
            return False
        frames = entry[2]
        self._orphan(frames)
        if entry[0] == "receive" and request_id not in self._part_of:  # a part's answer comes under its joined id
            self._dropped_with(request_id, frames.most - frames.got if frames.most else sys.maxsize)
        return True

    def fail_all(self, error: BaseException) -> None:
        self._joined.clear()
        self._part_of.clear()
        joined, self._joined_frames = self._joined_frames, {}
        for received in joined.values():
            self._orphan(received)
        waiting, self._waiting = self._waiting, {}
        for _, future, frames in waiting.values():
            self._orphan(frames)
            if not future.done():  # each caller its own error: `send_many` sets its receipts on the one it gets
                future.set_exception(copy.copy(error))

    def _cut(self, request_id: int, frames: Answer, futures: list[asyncio.Future[Any]]) -> None:
        """End an answer past its batch: each caller's error, what it brought given back, the request cancelled."""
        error = frames.too_many()
        for future in futures:
            if not future.done():
                future.set_exception(copy.copy(error))
        self._orphan(frames)
        self._dropped_with(request_id, 0)
        if self._cancel is not None:
            self._cancel(request_id)

    def _dropped_with(self, request_id: int, left: int) -> None:
        if len(self._dropped) >= MAX_PENDING_REQUESTS:
            del self._dropped[next(iter(self._dropped))]
        self._dropped[request_id] = left

    def _late(self, request_id: int, frame: ext.ReceiveMessagesResponse) -> None:
        """A messages frame of no request waiting: given back if this stream dropped its request and it is within
        that request's batch; else dropped and logged (the 1st, 10th, 100th ... such frame)."""
        left = self._dropped.get(request_id, -1) - len(frame.messages.messages)
        if left >= 0:
            self._dropped[request_id] = left
            self._orphan([frame])
            return
        self._dropped.pop(request_id, None)
        self._strays += 1
        if str(self._strays).rstrip("0") == "1":
            log.warning(
                "session: %d frame(s) of messages so far under ids of no request of this client's (the latest: %d): "
                "dropped, not given back",
                self._strays,
                request_id,
            )

    def _orphan(self, frames: Sequence[Any]) -> None:
        messages = [m for frame in frames if frame.WhichOneof("content") == "messages" for m in frame.messages.messages]
        if messages and self._orphaned is not None:
            try:
                self._orphaned(messages)
            except Exception:  # a give-back's failure must not end the stream for the other requests
                log.exception("giving back the messages of an answer nobody waits for failed")
