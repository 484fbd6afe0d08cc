"""Which permissions each v2 request needs, checked before its handler runs (proxy/auth.py does the checking).

SendMessage: publish to every message's topic (popgate.ext.v1 SendShared: every run's);
EndTransaction and RecallMessage: publish to the topic (the broker refuses a transaction id or recall handle of
another topic). ReceiveMessage, AckMessage, ChangeInvisibleDuration (one or many), ForwardMessageToDeadLetterQueue:
subscribe to the topic and consume as the group. Heartbeat and NotifyClientTermination naming a group: consume as
the group (as RocketMQ's proxy asks SUB on it; a producer's name none). Everything else (route, assignment,
telemetry, a producer's heartbeat and termination): a valid key is enough.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from popgate_pb.ext import messaging_pb2 as ext
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract import errors
from popgate_contract.validation import MAX_CLIENT_ID_CHARS, has_control
from proxy import validate
from proxy.auth import Authenticator, authorize, matches

_CONSUME = (
    pb.AckMessageRequest,
    pb.ChangeInvisibleDurationRequest,
    ext.ChangeInvisibleMany,
    pb.ForwardMessageToDeadLetterQueueRequest,
)


def metadata_of(invocation_metadata: Iterable[Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in invocation_metadata or ():
        # A str (a `Refusal` among them) is kept as it is.
        out[str(key).lower()] = value.decode(errors="replace") if isinstance(value, bytes) else value
    return out


CLIENT_ID = "x-mq-client-id"
# The official clients' ids are a host name and a few numbers (~40 characters; a DNS name is at most 253). The proxy
# remembers the ids it hears from (proxy.renewal), so an id is bounded (popgate_contract.validation, the brokers'
# bound on the consumer reports too) and a longer one refused before anything is popped for it —
# tests/integration/proxy/test_client_ids.py.


def client_id_of(invocation_metadata: Iterable[Any] | None) -> str:
    """The client's id (the official clients send it on every call and once on the Telemetry stream), else "";
    BadRequest when it is longer than MAX_CLIENT_ID_CHARS."""
    for key, value in invocation_metadata or ():
        if key == CLIENT_ID:  # grpc gives metadata keys lower-cased
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            if len(text) > MAX_CLIENT_ID_CHARS:
                raise errors.BadRequest(f"{CLIENT_ID} is {len(text)} characters long; at most {MAX_CLIENT_ID_CHARS}")
            if has_control(text):  # it is printed to operators (`popgate group consumers`)
                raise errors.BadRequest(f"{CLIENT_ID} has a control character")
            return text
    return ""


def _topic(resource: v2.Resource) -> str:
    """Rules name resources as brokers store them: `orders` of namespace `a` is `a%orders`."""
    return validate.topic_in(resource.resource_namespace, resource.name)


def _group(resource: v2.Resource) -> str:
    return validate.group_in(resource.resource_namespace, resource.name)


def publishable(auth: Authenticator, invocation_metadata: Iterable[Any] | None) -> Callable[[str], bool]:
    """Whether the caller may publish to a topic (as stored): what a Telemetry stream's producer is checked
    against before it is handed transaction checks of a topic (proxy.txchecks) —
    tests/unit/proxy/test_auth.py::test_a_producer_gets_checks_only_of_topics_it_may_publish_to."""
    if not auth.enabled:
        return lambda topic: True
    account = auth.authenticate(metadata_of(invocation_metadata))
    return lambda topic: account is None or matches(account.publish, topic)


def check(auth: Authenticator, invocation_metadata: Iterable[Any] | None, request: Any) -> str:
    """The caller's access key ("" without accounts: whose client ids its calls name, proxy.renewal.owner);
    Unauthorized / Forbidden (proxy errors) unless the caller may make this request."""
    if not auth.enabled:
        return ""
    account = auth.authenticate(metadata_of(invocation_metadata))
    # A send's topics are read only once its count is one its handler takes (proxy/v2/send.py checks it again).
    if isinstance(request, pb.SendMessageRequest):
        validate.send_count(len(request.messages))
        authorize(account, publish=sorted({_topic(m.topic) for m in request.messages}))
    elif isinstance(request, ext.SendShared):
        validate.shared_runs(len(request.runs))
        authorize(account, publish=sorted({_topic(run.shared.topic) for run in request.runs}))
    elif isinstance(request, pb.ReceiveMessageRequest):
        authorize(account, subscribe=[_topic(request.message_queue.topic)], group=_group(request.group))
    elif isinstance(request, _CONSUME):
        authorize(account, subscribe=[_topic(request.topic)], group=_group(request.group))
    elif isinstance(request, pb.EndTransactionRequest | pb.RecallMessageRequest):
        authorize(account, publish=[_topic(request.topic)])
    elif isinstance(request, pb.HeartbeatRequest | pb.NotifyClientTerminationRequest) and request.group.name:
        # tests/integration/proxy/test_client_accounts.py::test_heartbeat_and_termination_naming_a_group_need_its_rights
        authorize(account, group=_group(request.group))
    return "" if account is None else account.access_key
