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
    __slots__ = ("broker", "code", "message")
    BROKER_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    broker: str
    code: str
    message: str
    def __init__(self, broker: _Optional[str] = ..., code: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

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
