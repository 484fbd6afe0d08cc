import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from popgate_pb.v2 import definition_pb2 as _definition_pb2
from popgate_pb.v2 import service_pb2 as _service_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionRequest(_message.Message):
    __slots__ = ("id", "timeout_ms", "cancel", "send", "receive", "ack", "change_invisible", "send_shared", "end_transaction", "change_invisible_many", "max_fifo", "more")
    ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_FIELD_NUMBER: _ClassVar[int]
    SEND_SHARED_FIELD_NUMBER: _ClassVar[int]
    END_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_MANY_FIELD_NUMBER: _ClassVar[int]
    MAX_FIFO_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    id: int
    timeout_ms: int
    cancel: bool
    send: _service_pb2.SendMessageRequest
    receive: _service_pb2.ReceiveMessageRequest
    ack: _service_pb2.AckMessageRequest
    change_invisible: _service_pb2.ChangeInvisibleDurationRequest
    send_shared: SendShared
    end_transaction: _service_pb2.EndTransactionRequest
    change_invisible_many: ChangeInvisibleMany
    max_fifo: int
    more: _containers.RepeatedCompositeFieldContainer[SessionRequest]
    def __init__(self, id: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., cancel: _Optional[bool] = ..., send: _Optional[_Union[_service_pb2.SendMessageRequest, _Mapping]] = ..., receive: _Optional[_Union[_service_pb2.ReceiveMessageRequest, _Mapping]] = ..., ack: _Optional[_Union[_service_pb2.AckMessageRequest, _Mapping]] = ..., change_invisible: _Optional[_Union[_service_pb2.ChangeInvisibleDurationRequest, _Mapping]] = ..., send_shared: _Optional[_Union[SendShared, _Mapping]] = ..., end_transaction: _Optional[_Union[_service_pb2.EndTransactionRequest, _Mapping]] = ..., change_invisible_many: _Optional[_Union[ChangeInvisibleMany, _Mapping]] = ..., max_fifo: _Optional[int] = ..., more: _Optional[_Iterable[_Union[SessionRequest, _Mapping]]] = ...) -> None: ...

class SendShared(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[SharedMessages]
    def __init__(self, runs: _Optional[_Iterable[_Union[SharedMessages, _Mapping]]] = ...) -> None: ...

class SharedMessages(_message.Message):
    __slots__ = ("shared", "bodies", "message_ids")
    SHARED_FIELD_NUMBER: _ClassVar[int]
    BODIES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    shared: _definition_pb2.Message
    bodies: _containers.RepeatedScalarFieldContainer[bytes]
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shared: _Optional[_Union[_definition_pb2.Message, _Mapping]] = ..., bodies: _Optional[_Iterable[bytes]] = ..., message_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ChangeInvisibleMany(_message.Message):
    __slots__ = ("group", "topic", "invisible_duration", "entries", "undelivered")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_DURATION_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    UNDELIVERED_FIELD_NUMBER: _ClassVar[int]
    group: _definition_pb2.Resource
    topic: _definition_pb2.Resource
    invisible_duration: _duration_pb2.Duration
    entries: _containers.RepeatedCompositeFieldContainer[_service_pb2.AckMessageEntry]
    undelivered: bool
    def __init__(self, group: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., topic: _Optional[_Union[_definition_pb2.Resource, _Mapping]] = ..., invisible_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., entries: _Optional[_Iterable[_Union[_service_pb2.AckMessageEntry, _Mapping]]] = ..., undelivered: _Optional[bool] = ...) -> None: ...

class ChangeInvisibleManyResponse(_message.Message):
    __slots__ = ("status", "entries")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    entries: _containers.RepeatedCompositeFieldContainer[_service_pb2.AckMessageResultEntry]
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., entries: _Optional[_Iterable[_Union[_service_pb2.AckMessageResultEntry, _Mapping]]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("id", "status", "send", "receive", "ack", "change_invisible", "end_transaction", "change_invisible_many", "more")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_FIELD_NUMBER: _ClassVar[int]
    END_TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    CHANGE_INVISIBLE_MANY_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    id: int
    status: _definition_pb2.Status
    send: _service_pb2.SendMessageResponse
    receive: ReceiveMessagesResponse
    ack: _service_pb2.AckMessageResponse
    change_invisible: _service_pb2.ChangeInvisibleDurationResponse
    end_transaction: _service_pb2.EndTransactionResponse
    change_invisible_many: ChangeInvisibleManyResponse
    more: _containers.RepeatedCompositeFieldContainer[SessionResponse]
    def __init__(self, id: _Optional[int] = ..., status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., send: _Optional[_Union[_service_pb2.SendMessageResponse, _Mapping]] = ..., receive: _Optional[_Union[ReceiveMessagesResponse, _Mapping]] = ..., ack: _Optional[_Union[_service_pb2.AckMessageResponse, _Mapping]] = ..., change_invisible: _Optional[_Union[_service_pb2.ChangeInvisibleDurationResponse, _Mapping]] = ..., end_transaction: _Optional[_Union[_service_pb2.EndTransactionResponse, _Mapping]] = ..., change_invisible_many: _Optional[_Union[ChangeInvisibleManyResponse, _Mapping]] = ..., more: _Optional[_Iterable[_Union[SessionResponse, _Mapping]]] = ...) -> None: ...

class ReceiveMessagesResponse(_message.Message):
    __slots__ = ("status", "messages")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    status: _definition_pb2.Status
    messages: Messages
    def __init__(self, status: _Optional[_Union[_definition_pb2.Status, _Mapping]] = ..., messages: _Optional[_Union[Messages, _Mapping]] = ...) -> None: ...

class Messages(_message.Message):
    __slots__ = ("messages", "delivery_timestamp")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_definition_pb2.Message]
    delivery_timestamp: _timestamp_pb2.Timestamp
    def __init__(self, messages: _Optional[_Iterable[_Union[_definition_pb2.Message, _Mapping]]] = ..., delivery_timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
