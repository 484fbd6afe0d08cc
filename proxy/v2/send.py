"""SendMessage: one or many messages, each checked, then stored by the core."""

from __future__ import annotations

import time

from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from proxy import errors
from proxy.v2.context import Call
from proxy.v2.convert import SendLimits, to_broker

MAX_MESSAGES = 1024


async def send_message(call: Call, request: pb.SendMessageRequest) -> pb.SendMessageResponse:
    count = len(request.messages)
    if not 1 <= count <= MAX_MESSAGES:
        raise errors.BadRequest(f"SendMessage carries {count} messages: must be 1..{MAX_MESSAGES}")
    # Before the bodies are copied into broker messages (a GZIP body counts at its compressed size here).
    call.proxy.check_send_room(request.messages)
    limits = SendLimits(call.settings.max_body_bytes, call.settings.max_delay_s)
    now = time.time()
    # Inflated GZIP bodies may fill no more than the largest request taken as sent: a 4 KB gzip of 4 MiB of
    # zeros per message made one 1.2 MB request cost the proxy 1.2 GB and its loop seconds (a review's probe).
    room = call.settings.max_message_bytes
    messages = []
    for m in request.messages:
        message = to_broker(m, limits, now_s=now, room=room)
        room -= len(message.body)
        messages.append(message)
    results = await call.proxy.send(messages, deadline=call.deadline)
    ok = v2.Status(code=v2.OK, message="OK")
    entries = [
        pb.SendResultEntry(status=ok, message_id=r.message_id or m.message_id, offset=r.offset)
        for r, m in zip(results, messages, strict=True)
    ]
    return pb.SendMessageResponse(status=ok, entries=entries)
