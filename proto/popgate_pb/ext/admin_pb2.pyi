from popgate_pb import broker_pb2 as _broker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListBrokersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Broker(_message.Message):
    __slots__ = ("name", "address", "up")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    UP_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    up: bool
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., up: _Optional[bool] = ...) -> None: ...

class ListBrokersResponse(_message.Message):
    __slots__ = ("brokers",)
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[Broker]
    def __init__(self, brokers: _Optional[_Iterable[_Union[Broker, _Mapping]]] = ...) -> None: ...

class BrokerFailure(_message.Message):
    __slots__ = ("broker", "code", "message", "outcome_unknown")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    broker: str
    code: str
    message: str
    outcome_unknown: bool
    def __init__(self, broker: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., outcome_unknown: _Optional[bool] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("answers", "failures")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[_broker_pb2.StatsResponse]
    failures: _containers.RepeatedCompositeFieldContainer[BrokerFailure]
    def __init__(self, answers: _Optional[_Iterable[_Union[_broker_pb2.StatsResponse, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[BrokerFailure, _Mapping]]] = ...) -> None: ...

class ListMessagesRequest(_message.Message):
    __slots__ = ("broker", "request")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    broker: str
    request: _broker_pb2.ListMessagesRequest
    def __init__(self, broker: _Optional[str] = ..., request: _Optional[_Union[_broker_pb2.ListMessagesRequest, _Mapping]] = ...) -> None: ...

class ResetOffsetResponse(_message.Message):
    __slots__ = ("answers", "failures")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[_broker_pb2.ResetOffsetResponse]
    failures: _containers.RepeatedCompositeFieldContainer[BrokerFailure]
    def __init__(self, answers: _Optional[_Iterable[_Union[_broker_pb2.ResetOffsetResponse, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[BrokerFailure, _Mapping]]] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ("answers", "failures")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[_broker_pb2.DeleteGroupResponse]
    failures: _containers.RepeatedCompositeFieldContainer[BrokerFailure]
    def __init__(self, answers: _Optional[_Iterable[_Union[_broker_pb2.DeleteGroupResponse, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[BrokerFailure, _Mapping]]] = ...) -> None: ...

class CreateTopicResponse(_message.Message):
    __slots__ = ("answers", "failures")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[_broker_pb2.CreateTopicResponse]
    failures: _containers.RepeatedCompositeFieldContainer[BrokerFailure]
    def __init__(self, answers: _Optional[_Iterable[_Union[_broker_pb2.CreateTopicResponse, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[BrokerFailure, _Mapping]]] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ("answers", "failures")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[_broker_pb2.DeleteTopicResponse]
    failures: _containers.RepeatedCompositeFieldContainer[BrokerFailure]
    def __init__(self, answers: _Optional[_Iterable[_Union[_broker_pb2.DeleteTopicResponse, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[BrokerFailure, _Mapping]]] = ...) -> None: ...

class QueryMessagesResponse(_message.Message):
    __slots__ = ("messages", "failures", "scanned", "scan_cut")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    SCANNED_FIELD_NUMBER: _ClassVar[int]
    SCAN_CUT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_broker_pb2.FoundMessage]
    failures: _containers.RepeatedCompositeFieldContainer[BrokerFailure]
    scanned: int
    scan_cut: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[_broker_pb2.FoundMessage, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[BrokerFailure, _Mapping]]] = ..., scanned: _Optional[int] = ..., scan_cut: _Optional[bool] = ...) -> None: ...

class ListConsumersResponse(_message.Message):
    __slots__ = ("consumers", "failures", "cut")
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    CUT_FIELD_NUMBER: _ClassVar[int]
    consumers: _containers.RepeatedCompositeFieldContainer[_broker_pb2.Consumer]
    failures: _containers.RepeatedCompositeFieldContainer[BrokerFailure]
    cut: bool
    def __init__(self, consumers: _Optional[_Iterable[_Union[_broker_pb2.Consumer, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[BrokerFailure, _Mapping]]] = ..., cut: _Optional[bool] = ...) -> None: ...
