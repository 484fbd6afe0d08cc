from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Message(_message.Message):
    __slots__ = ("topic", "queue_id", "message_id", "body", "tag", "keys", "properties", "born_ms", "deliver_at_ms", "delay_level", "message_group", "born_host", "priority", "transactional", "v2_system", "trace_context")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BORN_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_GROUP_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONAL_FIELD_NUMBER: _ClassVar[int]
    V2_SYSTEM_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    message_id: str
    body: bytes
    tag: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    properties: _containers.ScalarMap[str, str]
    born_ms: int
    deliver_at_ms: int
    delay_level: int
    message_group: str
    born_host: str
    priority: int
    transactional: bool
    v2_system: bytes
    trace_context: str
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., message_id: _Optional[str] = ..., body: _Optional[bytes] = ..., tag: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., properties: _Optional[_Mapping[str, str]] = ..., born_ms: _Optional[int] = ..., deliver_at_ms: _Optional[int] = ..., delay_level: _Optional[int] = ..., message_group: _Optional[str] = ..., born_host: _Optional[str] = ..., priority: _Optional[int] = ..., transactional: _Optional[bool] = ..., v2_system: _Optional[bytes] = ..., trace_context: _Optional[str] = ...) -> None: ...

class StoredMessage(_message.Message):
    __slots__ = ("message", "queue_id", "offset", "store_ms")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    STORE_MS_FIELD_NUMBER: _ClassVar[int]
    message: Message
    queue_id: int
    offset: int
    store_ms: int
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., store_ms: _Optional[int] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("messages", "runs", "timeout_ms")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    runs: _containers.RepeatedCompositeFieldContainer[SharedRun]
    timeout_ms: int
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[SharedRun, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class SharedRun(_message.Message):
    __slots__ = ("shared", "bodies", "message_ids")
    SHARED_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    shared: Message
    bodies: _containers.RepeatedScalarFieldContainer[bytes]
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shared: _Optional[_Union[Message, _Mapping]] = ..., bodies: _Optional[_Iterable[bytes]] = ..., message_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("message_id", "topic", "queue_id", "offset", "recall_handle", "transaction_id")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECALL_HANDLE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    topic: str
    queue_id: int
    offset: int
    recall_handle: str
    transaction_id: str
    def __init__(self, message_id: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., recall_handle: _Optional[str] = ..., transaction_id: _Optional[str] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ...) -> None: ...

class PopRequest(_message.Message):
    __slots__ = ("topic", "group", "filter", "max_messages", "invisible_ms", "poll_ms", "v2", "max_fifo")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    POLL_MS_FIELD_NUMBER: _ClassVar[int]
    V2_FIELD_NUMBER: _ClassVar[int]
    MAX_FIFO_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    filter: str
    max_messages: int
    invisible_ms: int
    poll_ms: int
    v2: bool
    max_fifo: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., filter: _Optional[str] = ..., max_messages: _Optional[int] = ..., invisible_ms: _Optional[int] = ..., poll_ms: _Optional[int] = ..., v2: _Optional[bool] = ..., max_fifo: _Optional[int] = ...) -> None: ...

class PoppedMessage(_message.Message):
    __slots__ = ("stored", "receipt_handle", "delivery_attempt", "invisible_until_ms")
    STORED_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    stored: StoredMessage
    receipt_handle: str
    delivery_attempt: int
    invisible_until_ms: int
    def __init__(self, stored: _Optional[_Union[StoredMessage, _Mapping]] = ..., receipt_handle: _Optional[str] = ..., delivery_attempt: _Optional[int] = ..., invisible_until_ms: _Optional[int] = ...) -> None: ...

class PopResponse(_message.Message):
    __slots__ = ("messages", "polling_full", "held", "closing")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    POLLING_FULL_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    CLOSING_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[PoppedMessage]
    polling_full: bool
    held: bool
    closing: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[PoppedMessage, _Mapping]]] = ..., polling_full: _Optional[bool] = ..., held: _Optional[bool] = ..., closing: _Optional[bool] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("topic", "group", "receipt_handles")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ...) -> None: ...

class AckResult(_message.Message):
    __slots__ = ("receipt_handle", "ok", "error", "error_message")
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    ok: bool
    error: str
    error_message: str
    def __init__(self, receipt_handle: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ...) -> None: ...

class ChangeInvisibleTimeRequest(_message.Message):
    __slots__ = ("topic", "group", "receipt_handle", "invisible_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    receipt_handle: str
    invisible_ms: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., invisible_ms: _Optional[int] = ...) -> None: ...

class ChangeInvisibleTimeResponse(_message.Message):
    __slots__ = ("receipt_handle", "invisible_until_ms")
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    receipt_handle: str
    invisible_until_ms: int
    def __init__(self, receipt_handle: _Optional[str] = ..., invisible_until_ms: _Optional[int] = ...) -> None: ...

class ChangeInvisibleTimesRequest(_message.Message):
    __slots__ = ("topic", "group", "receipt_handles", "invisible_ms", "undelivered")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    UNDELIVERED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    invisible_ms: int
    undelivered: bool
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ..., invisible_ms: _Optional[int] = ..., undelivered: _Optional[bool] = ...) -> None: ...

class ChangeInvisibleTimeResult(_message.Message):
    __slots__ = ("ok", "receipt_handle", "invisible_until_ms", "error", "error_message")
    OK_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    receipt_handle: str
    invisible_until_ms: int
    error: str
    error_message: str
    def __init__(self, ok: _Optional[bool] = ..., receipt_handle: _Optional[str] = ..., invisible_until_ms: _Optional[int] = ..., error: _Optional[str] = ..., error_message: _Optional[str] = ...) -> None: ...

class ChangeInvisibleTimesResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ChangeInvisibleTimeResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ChangeInvisibleTimeResult, _Mapping]]] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("group", "receipt_handles", "invisible_ms", "bring_forward")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLES_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_MS_FIELD_NUMBER: _ClassVar[int]
    BRING_FORWARD_FIELD_NUMBER: _ClassVar[int]
    group: str
    receipt_handles: _containers.RepeatedScalarFieldContainer[str]
    invisible_ms: int
    bring_forward: bool
    def __init__(self, group: _Optional[str] = ..., receipt_handles: _Optional[_Iterable[str]] = ..., invisible_ms: _Optional[int] = ..., bring_forward: _Optional[bool] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("results", "invisible_until_ms")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AckResult]
    invisible_until_ms: int
    def __init__(self, results: _Optional[_Iterable[_Union[AckResult, _Mapping]]] = ..., invisible_until_ms: _Optional[int] = ...) -> None: ...

class NotificationRequest(_message.Message):
    __slots__ = ("topic", "group", "filter", "poll_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    POLL_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    filter: str
    poll_ms: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., filter: _Optional[str] = ..., poll_ms: _Optional[int] = ...) -> None: ...

class NotificationResponse(_message.Message):
    __slots__ = ("has_message", "polling_full", "closing")
    HAS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POLLING_FULL_FIELD_NUMBER: _ClassVar[int]
    CLOSING_FIELD_NUMBER: _ClassVar[int]
    has_message: bool
    polling_full: bool
    closing: bool
    def __init__(self, has_message: _Optional[bool] = ..., polling_full: _Optional[bool] = ..., closing: _Optional[bool] = ...) -> None: ...

class DeadLetterRequest(_message.Message):
    __slots__ = ("topic", "group", "receipt_handle", "message_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    receipt_handle: str
    message_id: str
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., receipt_handle: _Optional[str] = ..., message_id: _Optional[str] = ...) -> None: ...

class DeadLetterResponse(_message.Message):
    __slots__ = ("dlq_topic", "offset")
    DLQ_TOPIC_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    dlq_topic: str
    offset: int
    def __init__(self, dlq_topic: _Optional[str] = ..., offset: _Optional[int] = ...) -> None: ...

class GroupConfigRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class GroupConfigResponse(_message.Message):
    __slots__ = ("max_delivery_attempts",)
    MAX_DELIVERY_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    max_delivery_attempts: int
    def __init__(self, max_delivery_attempts: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("topic", "group")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("topic", "queue_id", "min_offset", "max_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class GroupQueueStats(_message.Message):
    __slots__ = ("topic", "group", "queue_id", "max_offset", "consumer_offset", "pull_offset", "ready", "inflight", "lag", "oldest_unacked_store_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PULL_OFFSET_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNACKED_STORE_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    queue_id: int
    max_offset: int
    consumer_offset: int
    pull_offset: int
    ready: int
    inflight: int
    lag: int
    oldest_unacked_store_ms: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., queue_id: _Optional[int] = ..., max_offset: _Optional[int] = ..., consumer_offset: _Optional[int] = ..., pull_offset: _Optional[int] = ..., ready: _Optional[int] = ..., inflight: _Optional[int] = ..., lag: _Optional[int] = ..., oldest_unacked_store_ms: _Optional[int] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("broker", "queues", "groups", "held_pops", "held_notifications", "now_ms", "cut")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    HELD_POPS_FIELD_NUMBER: _ClassVar[int]
    HELD_NOTIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    broker: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueStats]
    groups: _containers.RepeatedCompositeFieldContainer[GroupQueueStats]
    held_pops: int
    held_notifications: int
    now_ms: int
    cut: bool
    def __init__(self, broker: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueStats, _Mapping]]] = ..., groups: _Optional[_Iterable[_Union[GroupQueueStats, _Mapping]]] = ..., held_pops: _Optional[int] = ..., held_notifications: _Optional[int] = ..., now_ms: _Optional[int] = ..., cut: _Optional[bool] = ...) -> None: ...

class ListMessagesRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "from_offset", "limit")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    from_offset: int
    limit: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., from_offset: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class ListMessagesResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StoredMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[StoredMessage, _Mapping]]] = ...) -> None: ...

class RecallRequest(_message.Message):
    __slots__ = ("topic", "recall_handle")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    RECALL_HANDLE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    recall_handle: str
    def __init__(self, topic: _Optional[str] = ..., recall_handle: _Optional[str] = ...) -> None: ...

class RecallResponse(_message.Message):
    __slots__ = ("message_id",)
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    def __init__(self, message_id: _Optional[str] = ...) -> None: ...

class EndTransactionRequest(_message.Message):
    __slots__ = ("topic", "message_id", "transaction_id", "commit", "from_check")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    FROM_CHECK_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_id: str
    transaction_id: str
    commit: bool
    from_check: bool
    def __init__(self, topic: _Optional[str] = ..., message_id: _Optional[str] = ..., transaction_id: _Optional[str] = ..., commit: _Optional[bool] = ..., from_check: _Optional[bool] = ...) -> None: ...

class EndTransactionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TransactionChecksRequest(_message.Message):
    __slots__ = ("topics", "max_checks", "asked_topics")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHECKS_FIELD_NUMBER: _ClassVar[int]
    ASKED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    max_checks: int
    asked_topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., max_checks: _Optional[int] = ..., asked_topics: _Optional[_Iterable[str]] = ...) -> None: ...

class TransactionCheck(_message.Message):
    __slots__ = ("message", "transaction_id", "check")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_ID_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    message: StoredMessage
    transaction_id: str
    check: int
    def __init__(self, message: _Optional[_Union[StoredMessage, _Mapping]] = ..., transaction_id: _Optional[str] = ..., check: _Optional[int] = ...) -> None: ...

class TransactionChecksResponse(_message.Message):
    __slots__ = ("checks", "next_due_ms", "now_ms", "check_interval_ms")
    CHECKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_DUE_MS_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    CHECK_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    checks: _containers.RepeatedCompositeFieldContainer[TransactionCheck]
    next_due_ms: int
    now_ms: int
    check_interval_ms: int
    def __init__(self, checks: _Optional[_Iterable[_Union[TransactionCheck, _Mapping]]] = ..., next_due_ms: _Optional[int] = ..., now_ms: _Optional[int] = ..., check_interval_ms: _Optional[int] = ...) -> None: ...

class ResetOffsetRequest(_message.Message):
    __slots__ = ("topic", "group", "to", "timestamp_ms")
    class To(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TO_UNSPECIFIED: _ClassVar[ResetOffsetRequest.To]
        EARLIEST: _ClassVar[ResetOffsetRequest.To]
        LATEST: _ClassVar[ResetOffsetRequest.To]
        TIMESTAMP: _ClassVar[ResetOffsetRequest.To]
    TO_UNSPECIFIED: ResetOffsetRequest.To
    EARLIEST: ResetOffsetRequest.To
    LATEST: ResetOffsetRequest.To
    TIMESTAMP: ResetOffsetRequest.To
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    to: ResetOffsetRequest.To
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., to: _Optional[_Union[ResetOffsetRequest.To, str]] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class QueueReset(_message.Message):
    __slots__ = ("queue_id", "offset", "dropped_inflight")
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DROPPED_INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    queue_id: int
    offset: int
    dropped_inflight: int
    def __init__(self, queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., dropped_inflight: _Optional[int] = ...) -> None: ...

class ResetOffsetResponse(_message.Message):
    __slots__ = ("broker", "queues")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    broker: str
    queues: _containers.RepeatedCompositeFieldContainer[QueueReset]
    def __init__(self, broker: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[QueueReset, _Mapping]]] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("group", "topic", "delete_dlq")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    DELETE_DLQ_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    delete_dlq: bool
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., delete_dlq: _Optional[bool] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ("broker", "topics", "dlq_deleted")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    DLQ_DELETED_FIELD_NUMBER: _ClassVar[int]
    broker: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    dlq_deleted: bool
    def __init__(self, broker: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., dlq_deleted: _Optional[bool] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic", "queues")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queues: int
    def __init__(self, topic: _Optional[str] = ..., queues: _Optional[int] = ...) -> None: ...

class CreateTopicResponse(_message.Message):
    __slots__ = ("broker", "created", "queues")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    broker: str
    created: bool
    queues: int
    def __init__(self, broker: _Optional[str] = ..., created: _Optional[bool] = ..., queues: _Optional[int] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ("broker", "existed", "messages", "groups", "held_ended", "rows_deleting")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    HELD_ENDED_FIELD_NUMBER: _ClassVar[int]
    ROWS_DELETING_FIELD_NUMBER: _ClassVar[int]
    broker: str
    existed: bool
    messages: int
    groups: _containers.RepeatedScalarFieldContainer[str]
    held_ended: int
    rows_deleting: bool
    def __init__(self, broker: _Optional[str] = ..., existed: _Optional[bool] = ..., messages: _Optional[int] = ..., groups: _Optional[_Iterable[str]] = ..., held_ended: _Optional[int] = ..., rows_deleting: _Optional[bool] = ...) -> None: ...

class QueryMessagesRequest(_message.Message):
    __slots__ = ("topic", "message_id", "key", "max_messages", "with_body", "max_scan")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    WITH_BODY_FIELD_NUMBER: _ClassVar[int]
    MAX_SCAN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_id: str
    key: str
    max_messages: int
    with_body: bool
    max_scan: int
    def __init__(self, topic: _Optional[str] = ..., message_id: _Optional[str] = ..., key: _Optional[str] = ..., max_messages: _Optional[int] = ..., with_body: _Optional[bool] = ..., max_scan: _Optional[int] = ...) -> None: ...

class FoundMessage(_message.Message):
    __slots__ = ("stored", "body_size", "broker")
    STORED_FIELD_NUMBER: _ClassVar[int]
    BODY_SIZE_FIELD_NUMBER: _ClassVar[int]
    BROKER_FIELD_NUMBER: _ClassVar[int]
    stored: StoredMessage
    body_size: int
    broker: str
    def __init__(self, stored: _Optional[_Union[StoredMessage, _Mapping]] = ..., body_size: _Optional[int] = ..., broker: _Optional[str] = ...) -> None: ...

class QueryMessagesResponse(_message.Message):
    __slots__ = ("broker", "messages", "scanned", "scan_cut")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SCANNED_FIELD_NUMBER: _ClassVar[int]
    SCAN_CUT_FIELD_NUMBER: _ClassVar[int]
    broker: str
    messages: _containers.RepeatedCompositeFieldContainer[FoundMessage]
    scanned: int
    scan_cut: bool
    def __init__(self, broker: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[FoundMessage, _Mapping]]] = ..., scanned: _Optional[int] = ..., scan_cut: _Optional[bool] = ...) -> None: ...

class Consumer(_message.Message):
    __slots__ = ("group", "client_id", "proxy", "last_seen_ms")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROXY_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_MS_FIELD_NUMBER: _ClassVar[int]
    group: str
    client_id: str
    proxy: str
    last_seen_ms: int
    def __init__(self, group: _Optional[str] = ..., client_id: _Optional[str] = ..., proxy: _Optional[str] = ..., last_seen_ms: _Optional[int] = ...) -> None: ...

class ReportConsumersRequest(_message.Message):
    __slots__ = ("proxy", "consumers", "ttl_ms")
    PROXY_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    proxy: str
    consumers: _containers.RepeatedCompositeFieldContainer[Consumer]
    ttl_ms: int
    def __init__(self, proxy: _Optional[str] = ..., consumers: _Optional[_Iterable[_Union[Consumer, _Mapping]]] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class ReportConsumersResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListConsumersRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class ListConsumersResponse(_message.Message):
    __slots__ = ("broker", "consumers", "cut")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    broker: str
    consumers: _containers.RepeatedCompositeFieldContainer[Consumer]
    cut: bool
    def __init__(self, broker: _Optional[str] = ..., consumers: _Optional[_Iterable[_Union[Consumer, _Mapping]]] = ..., cut: _Optional[bool] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("id", "pop", "notification", "cancel", "send", "ack", "change_invisible", "renew", "group_config", "end_transaction", "change_invisible_many", "more")
    ID_FIELD_NUMBER: _ClassVar[int]
    POP_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    GROUP_CONFIG_FIELD_NUMBER: _ClassVar[int]
    END_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_MANY_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    id: int
    pop: PopRequest
    notification: NotificationRequest
    cancel: bool
    send: SendRequest
    ack: AckRequest
    change_invisible: ChangeInvisibleTimeRequest
    renew: RenewRequest
    group_config: GroupConfigRequest
    end_transaction: EndTransactionRequest
    change_invisible_many: ChangeInvisibleTimesRequest
    more: _containers.RepeatedCompositeFieldContainer[SessionRequest]
    def __init__(self, id: _Optional[int] = ..., pop: _Optional[_Union[PopRequest, _Mapping]] = ..., notification: _Optional[_Union[NotificationRequest, _Mapping]] = ..., cancel: _Optional[bool] = ..., send: _Optional[_Union[SendRequest, _Mapping]] = ..., ack: _Optional[_Union[AckRequest, _Mapping]] = ..., change_invisible: _Optional[_Union[ChangeInvisibleTimeRequest, _Mapping]] = ..., renew: _Optional[_Union[RenewRequest, _Mapping]] = ..., group_config: _Optional[_Union[GroupConfigRequest, _Mapping]] = ..., end_transaction: _Optional[_Union[EndTransactionRequest, _Mapping]] = ..., change_invisible_many: _Optional[_Union[ChangeInvisibleTimesRequest, _Mapping]] = ..., more: _Optional[_Iterable[_Union[SessionRequest, _Mapping]]] = ...) -> None: ...

class SessionError(_message.Message):
    __slots__ = ("error", "message", "grpc_code")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GRPC_CODE_FIELD_NUMBER: _ClassVar[int]
    error: str
    message: str
    grpc_code: int
    def __init__(self, error: _Optional[str] = ..., message: _Optional[str] = ..., grpc_code: _Optional[int] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("id", "pop", "notification", "error", "send", "ack", "change_invisible", "renew", "group_config", "end_transaction", "change_invisible_many", "more")
    ID_FIELD_NUMBER: _ClassVar[int]
    POP_FIELD_NUMBER: _ClassVar[int]
    NOTIFICATION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    GROUP_CONFIG_FIELD_NUMBER: _ClassVar[int]
    END_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_MANY_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    id: int
    pop: PopResponse
    notification: NotificationResponse
    error: SessionError
    send: SendResponse
    ack: AckResponse
    change_invisible: ChangeInvisibleTimeResponse
    renew: RenewResponse
    group_config: GroupConfigResponse
    end_transaction: EndTransactionResponse
    change_invisible_many: ChangeInvisibleTimesResponse
    more: _containers.RepeatedCompositeFieldContainer[SessionResponse]
    def __init__(self, id: _Optional[int] = ..., pop: _Optional[_Union[PopResponse, _Mapping]] = ..., notification: _Optional[_Union[NotificationResponse, _Mapping]] = ..., error: _Optional[_Union[SessionError, _Mapping]] = ..., send: _Optional[_Union[SendResponse, _Mapping]] = ..., ack: _Optional[_Union[AckResponse, _Mapping]] = ..., change_invisible: _Optional[_Union[ChangeInvisibleTimeResponse, _Mapping]] = ..., renew: _Optional[_Union[RenewResponse, _Mapping]] = ..., group_config: _Optional[_Union[GroupConfigResponse, _Mapping]] = ..., end_transaction: _Optional[_Union[EndTransactionResponse, _Mapping]] = ..., change_invisible_many: _Optional[_Union[ChangeInvisibleTimesResponse, _Mapping]] = ..., more: _Optional[_Iterable[_Union[SessionResponse, _Mapping]]] = ...) -> None: ...
