import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransactionResolution(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSACTION_RESOLUTION_UNSPECIFIED: _ClassVar[TransactionResolution]
    COMMIT: _ClassVar[TransactionResolution]
    ROLLBACK: _ClassVar[TransactionResolution]

class TransactionSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SOURCE_UNSPECIFIED: _ClassVar[TransactionSource]
    SOURCE_CLIENT: _ClassVar[TransactionSource]
    SOURCE_SERVER_CHECK: _ClassVar[TransactionSource]

class Permission(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PERMISSION_UNSPECIFIED: _ClassVar[Permission]
    NONE: _ClassVar[Permission]
    READ: _ClassVar[Permission]
    WRITE: _ClassVar[Permission]
    READ_WRITE: _ClassVar[Permission]

class FilterType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILTER_TYPE_UNSPECIFIED: _ClassVar[FilterType]
    TAG: _ClassVar[FilterType]
    SQL: _ClassVar[FilterType]

class AddressScheme(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ADDRESS_SCHEME_UNSPECIFIED: _ClassVar[AddressScheme]
    IPv4: _ClassVar[AddressScheme]
    IPv6: _ClassVar[AddressScheme]
    DOMAIN_NAME: _ClassVar[AddressScheme]

class MessageType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_TYPE_UNSPECIFIED: _ClassVar[MessageType]
    NORMAL: _ClassVar[MessageType]
    FIFO: _ClassVar[MessageType]
    DELAY: _ClassVar[MessageType]
    TRANSACTION: _ClassVar[MessageType]
    LITE: _ClassVar[MessageType]
    PRIORITY: _ClassVar[MessageType]

class DigestType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIGEST_TYPE_UNSPECIFIED: _ClassVar[DigestType]
    CRC32: _ClassVar[DigestType]
    MD5: _ClassVar[DigestType]
    SHA1: _ClassVar[DigestType]

class ClientType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLIENT_TYPE_UNSPECIFIED: _ClassVar[ClientType]
    PRODUCER: _ClassVar[ClientType]
    PUSH_CONSUMER: _ClassVar[ClientType]
    SIMPLE_CONSUMER: _ClassVar[ClientType]
    PULL_CONSUMER: _ClassVar[ClientType]
    LITE_PUSH_CONSUMER: _ClassVar[ClientType]
    LITE_SIMPLE_CONSUMER: _ClassVar[ClientType]

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_UNSPECIFIED: _ClassVar[Encoding]
    IDENTITY: _ClassVar[Encoding]
    GZIP: _ClassVar[Encoding]

class Code(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CODE_UNSPECIFIED: _ClassVar[Code]
    OK: _ClassVar[Code]
    MULTIPLE_RESULTS: _ClassVar[Code]
    BAD_REQUEST: _ClassVar[Code]
    ILLEGAL_ACCESS_POINT: _ClassVar[Code]
    ILLEGAL_TOPIC: _ClassVar[Code]
    ILLEGAL_CONSUMER_GROUP: _ClassVar[Code]
    ILLEGAL_MESSAGE_TAG: _ClassVar[Code]
    ILLEGAL_MESSAGE_KEY: _ClassVar[Code]
    ILLEGAL_MESSAGE_GROUP: _ClassVar[Code]
    ILLEGAL_MESSAGE_PROPERTY_KEY: _ClassVar[Code]
    INVALID_TRANSACTION_ID: _ClassVar[Code]
    ILLEGAL_MESSAGE_ID: _ClassVar[Code]
    ILLEGAL_FILTER_EXPRESSION: _ClassVar[Code]
    ILLEGAL_INVISIBLE_TIME: _ClassVar[Code]
    ILLEGAL_DELIVERY_TIME: _ClassVar[Code]
    INVALID_RECEIPT_HANDLE: _ClassVar[Code]
    MESSAGE_PROPERTY_CONFLICT_WITH_TYPE: _ClassVar[Code]
    UNRECOGNIZED_CLIENT_TYPE: _ClassVar[Code]
    MESSAGE_CORRUPTED: _ClassVar[Code]
    CLIENT_ID_REQUIRED: _ClassVar[Code]
    ILLEGAL_POLLING_TIME: _ClassVar[Code]
    ILLEGAL_OFFSET: _ClassVar[Code]
    ILLEGAL_LITE_TOPIC: _ClassVar[Code]
    UNAUTHORIZED: _ClassVar[Code]
    PAYMENT_REQUIRED: _ClassVar[Code]
    FORBIDDEN: _ClassVar[Code]
    NOT_FOUND: _ClassVar[Code]
    MESSAGE_NOT_FOUND: _ClassVar[Code]
    TOPIC_NOT_FOUND: _ClassVar[Code]
    CONSUMER_GROUP_NOT_FOUND: _ClassVar[Code]
    OFFSET_NOT_FOUND: _ClassVar[Code]
    REQUEST_TIMEOUT: _ClassVar[Code]
    PAYLOAD_TOO_LARGE: _ClassVar[Code]
    MESSAGE_BODY_TOO_LARGE: _ClassVar[Code]
    MESSAGE_BODY_EMPTY: _ClassVar[Code]
    PRECONDITION_FAILED: _ClassVar[Code]
    TOO_MANY_REQUESTS: _ClassVar[Code]
    LITE_TOPIC_QUOTA_EXCEEDED: _ClassVar[Code]
    LITE_SUBSCRIPTION_QUOTA_EXCEEDED: _ClassVar[Code]
    REQUEST_HEADER_FIELDS_TOO_LARGE: _ClassVar[Code]
    MESSAGE_PROPERTIES_TOO_LARGE: _ClassVar[Code]
    INTERNAL_ERROR: _ClassVar[Code]
    INTERNAL_SERVER_ERROR: _ClassVar[Code]
    HA_NOT_AVAILABLE: _ClassVar[Code]
    NOT_IMPLEMENTED: _ClassVar[Code]
    PROXY_TIMEOUT: _ClassVar[Code]
    MASTER_PERSISTENCE_TIMEOUT: _ClassVar[Code]
    SLAVE_PERSISTENCE_TIMEOUT: _ClassVar[Code]
    UNSUPPORTED: _ClassVar[Code]
    VERSION_UNSUPPORTED: _ClassVar[Code]
    VERIFY_FIFO_MESSAGE_UNSUPPORTED: _ClassVar[Code]
    FAILED_TO_CONSUME_MESSAGE: _ClassVar[Code]

class Language(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LANGUAGE_UNSPECIFIED: _ClassVar[Language]
    JAVA: _ClassVar[Language]
    CPP: _ClassVar[Language]
    DOT_NET: _ClassVar[Language]
    GOLANG: _ClassVar[Language]
    RUST: _ClassVar[Language]
    PYTHON: _ClassVar[Language]
    PHP: _ClassVar[Language]
    NODE_JS: _ClassVar[Language]
    RUBY: _ClassVar[Language]
    OBJECTIVE_C: _ClassVar[Language]
    DART: _ClassVar[Language]
    KOTLIN: _ClassVar[Language]

class LiteSubscriptionAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PARTIAL_ADD: _ClassVar[LiteSubscriptionAction]
    PARTIAL_REMOVE: _ClassVar[LiteSubscriptionAction]
    COMPLETE_ADD: _ClassVar[LiteSubscriptionAction]
    COMPLETE_REMOVE: _ClassVar[LiteSubscriptionAction]

class QueryOffsetPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BEGINNING: _ClassVar[QueryOffsetPolicy]
    END: _ClassVar[QueryOffsetPolicy]
    TIMESTAMP: _ClassVar[QueryOffsetPolicy]
TRANSACTION_RESOLUTION_UNSPECIFIED: TransactionResolution
COMMIT: TransactionResolution
ROLLBACK: TransactionResolution
SOURCE_UNSPECIFIED: TransactionSource
SOURCE_CLIENT: TransactionSource
SOURCE_SERVER_CHECK: TransactionSource
PERMISSION_UNSPECIFIED: Permission
NONE: Permission
READ: Permission
WRITE: Permission
READ_WRITE: Permission
FILTER_TYPE_UNSPECIFIED: FilterType
TAG: FilterType
SQL: FilterType
ADDRESS_SCHEME_UNSPECIFIED: AddressScheme
IPv4: AddressScheme
IPv6: AddressScheme
DOMAIN_NAME: AddressScheme
MESSAGE_TYPE_UNSPECIFIED: MessageType
NORMAL: MessageType
FIFO: MessageType
DELAY: MessageType
TRANSACTION: MessageType
LITE: MessageType
PRIORITY: MessageType
DIGEST_TYPE_UNSPECIFIED: DigestType
CRC32: DigestType
MD5: DigestType
SHA1: DigestType
CLIENT_TYPE_UNSPECIFIED: ClientType
PRODUCER: ClientType
PUSH_CONSUMER: ClientType
SIMPLE_CONSUMER: ClientType
PULL_CONSUMER: ClientType
LITE_PUSH_CONSUMER: ClientType
LITE_SIMPLE_CONSUMER: ClientType
ENCODING_UNSPECIFIED: Encoding
IDENTITY: Encoding
GZIP: Encoding
CODE_UNSPECIFIED: Code
OK: Code
MULTIPLE_RESULTS: Code
BAD_REQUEST: Code
ILLEGAL_ACCESS_POINT: Code
ILLEGAL_TOPIC: Code
ILLEGAL_CONSUMER_GROUP: Code
ILLEGAL_MESSAGE_TAG: Code
ILLEGAL_MESSAGE_KEY: Code
ILLEGAL_MESSAGE_GROUP: Code
ILLEGAL_MESSAGE_PROPERTY_KEY: Code
INVALID_TRANSACTION_ID: Code
ILLEGAL_MESSAGE_ID: Code
ILLEGAL_FILTER_EXPRESSION: Code
ILLEGAL_INVISIBLE_TIME: Code
ILLEGAL_DELIVERY_TIME: Code
INVALID_RECEIPT_HANDLE: Code
MESSAGE_PROPERTY_CONFLICT_WITH_TYPE: Code
UNRECOGNIZED_CLIENT_TYPE: Code
MESSAGE_CORRUPTED: Code
CLIENT_ID_REQUIRED: Code
ILLEGAL_POLLING_TIME: Code
ILLEGAL_OFFSET: Code
ILLEGAL_LITE_TOPIC: Code
UNAUTHORIZED: Code
PAYMENT_REQUIRED: Code
FORBIDDEN: Code
NOT_FOUND: Code
MESSAGE_NOT_FOUND: Code
TOPIC_NOT_FOUND: Code
CONSUMER_GROUP_NOT_FOUND: Code
OFFSET_NOT_FOUND: Code
REQUEST_TIMEOUT: Code
PAYLOAD_TOO_LARGE: Code
MESSAGE_BODY_TOO_LARGE: Code
MESSAGE_BODY_EMPTY: Code
PRECONDITION_FAILED: Code
TOO_MANY_REQUESTS: Code
LITE_TOPIC_QUOTA_EXCEEDED: Code
LITE_SUBSCRIPTION_QUOTA_EXCEEDED: Code
REQUEST_HEADER_FIELDS_TOO_LARGE: Code
MESSAGE_PROPERTIES_TOO_LARGE: Code
INTERNAL_ERROR: Code
INTERNAL_SERVER_ERROR: Code
HA_NOT_AVAILABLE: Code
NOT_IMPLEMENTED: Code
PROXY_TIMEOUT: Code
MASTER_PERSISTENCE_TIMEOUT: Code
SLAVE_PERSISTENCE_TIMEOUT: Code
UNSUPPORTED: Code
VERSION_UNSUPPORTED: Code
VERIFY_FIFO_MESSAGE_UNSUPPORTED: Code
FAILED_TO_CONSUME_MESSAGE: Code
LANGUAGE_UNSPECIFIED: Language
JAVA: Language
CPP: Language
DOT_NET: Language
GOLANG: Language
RUST: Language
PYTHON: Language
PHP: Language
NODE_JS: Language
RUBY: Language
OBJECTIVE_C: Language
DART: Language
KOTLIN: Language
PARTIAL_ADD: LiteSubscriptionAction
PARTIAL_REMOVE: LiteSubscriptionAction
COMPLETE_ADD: LiteSubscriptionAction
COMPLETE_REMOVE: LiteSubscriptionAction
BEGINNING: QueryOffsetPolicy
END: QueryOffsetPolicy
TIMESTAMP: QueryOffsetPolicy

class FilterExpression(_message.Message):
    __slots__ = ("type", "expression")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    type: FilterType
    expression: str
    def __init__(self, type: _Optional[_Union[FilterType, str]] = ..., expression: _Optional[str] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "exponential_backoff", "customized_backoff")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    EXPONENTIAL_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    CUSTOMIZED_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    exponential_backoff: ExponentialBackoff
    customized_backoff: CustomizedBackoff
    def __init__(self, max_attempts: _Optional[int] = ..., exponential_backoff: _Optional[_Union[ExponentialBackoff, _Mapping]] = ..., customized_backoff: _Optional[_Union[CustomizedBackoff, _Mapping]] = ...) -> None: ...

class ExponentialBackoff(_message.Message):
    __slots__ = ("initial", "max", "multiplier")
    INITIAL_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    initial: _duration_pb2.Duration
    max: _duration_pb2.Duration
    multiplier: float
    def __init__(self, initial: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., multiplier: _Optional[float] = ...) -> None: ...

class CustomizedBackoff(_message.Message):
    __slots__ = ("next",)
    NEXT_FIELD_NUMBER: _ClassVar[int]
    next: _containers.RepeatedCompositeFieldContainer[_duration_pb2.Duration]
    def __init__(self, next: _Optional[_Iterable[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]]] = ...) -> None: ...

class Resource(_message.Message):
    __slots__ = ("resource_namespace", "name")
    RESOURCE_NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    resource_namespace: str
    name: str
    def __init__(self, resource_namespace: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class SubscriptionEntry(_message.Message):
    __slots__ = ("topic", "expression")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    topic: Resource
    expression: FilterExpression
    def __init__(self, topic: _Optional[_Union[Resource, _Mapping]] = ..., expression: _Optional[_Union[FilterExpression, _Mapping]] = ...) -> None: ...

class Address(_message.Message):
    __slots__ = ("host", "port")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    host: str
    port: int
    def __init__(self, host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class Endpoints(_message.Message):
    __slots__ = ("scheme", "addresses")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    scheme: AddressScheme
    addresses: _containers.RepeatedCompositeFieldContainer[Address]
    def __init__(self, scheme: _Optional[_Union[AddressScheme, str]] = ..., addresses: _Optional[_Iterable[_Union[Address, _Mapping]]] = ...) -> None: ...

class Broker(_message.Message):
    __slots__ = ("name", "id", "endpoints")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    id: int
    endpoints: Endpoints
    def __init__(self, name: _Optional[str] = ..., id: _Optional[int] = ..., endpoints: _Optional[_Union[Endpoints, _Mapping]] = ...) -> None: ...

class MessageQueue(_message.Message):
    __slots__ = ("topic", "id", "permission", "broker", "accept_message_types")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    BROKER_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_MESSAGE_TYPES_FIELD_NUMBER: _ClassVar[int]
    topic: Resource
    id: int
    permission: Permission
    broker: Broker
    accept_message_types: _containers.RepeatedScalarFieldContainer[MessageType]
    def __init__(self, topic: _Optional[_Union[Resource, _Mapping]] = ..., id: _Optional[int] = ..., permission: _Optional[_Union[Permission, str]] = ..., broker: _Optional[_Union[Broker, _Mapping]] = ..., accept_message_types: _Optional[_Iterable[_Union[MessageType, str]]] = ...) -> None: ...

class Digest(_message.Message):
    __slots__ = ("type", "checksum")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    type: DigestType
    checksum: str
    def __init__(self, type: _Optional[_Union[DigestType, str]] = ..., checksum: _Optional[str] = ...) -> None: ...

class SystemProperties(_message.Message):
    __slots__ = ("tag", "keys", "message_id", "body_digest", "body_encoding", "message_type", "born_timestamp", "born_host", "store_timestamp", "store_host", "delivery_timestamp", "receipt_handle", "queue_id", "queue_offset", "invisible_duration", "delivery_attempt", "message_group", "trace_context", "orphaned_transaction_recovery_duration", "dead_letter_queue", "lite_topic", "priority")
    TAG_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_DIGEST_FIELD_NUMBER: _ClassVar[int]
    BODY_ENCODING_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    BORN_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_HANDLE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    INVISIBLE_DURATION_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_GROUP_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ORPHANED_TRANSACTION_RECOVERY_DURATION_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    LITE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    tag: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    message_id: str
    body_digest: Digest
    body_encoding: Encoding
    message_type: MessageType
    born_timestamp: _timestamp_pb2.Timestamp
    born_host: str
    store_timestamp: _timestamp_pb2.Timestamp
    store_host: str
    delivery_timestamp: _timestamp_pb2.Timestamp
    receipt_handle: str
    queue_id: int
    queue_offset: int
    invisible_duration: _duration_pb2.Duration
    delivery_attempt: int
    message_group: str
    trace_context: str
    orphaned_transaction_recovery_duration: _duration_pb2.Duration
    dead_letter_queue: DeadLetterQueue
    lite_topic: str
    priority: int
    def __init__(self, tag: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., message_id: _Optional[str] = ..., body_digest: _Optional[_Union[Digest, _Mapping]] = ..., body_encoding: _Optional[_Union[Encoding, str]] = ..., message_type: _Optional[_Union[MessageType, str]] = ..., born_timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., born_host: _Optional[str] = ..., store_timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., store_host: _Optional[str] = ..., delivery_timestamp: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., receipt_handle: _Optional[str] = ..., queue_id: _Optional[int] = ..., queue_offset: _Optional[int] = ..., invisible_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., delivery_attempt: _Optional[int] = ..., message_group: _Optional[str] = ..., trace_context: _Optional[str] = ..., orphaned_transaction_recovery_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., dead_letter_queue: _Optional[_Union[DeadLetterQueue, _Mapping]] = ..., lite_topic: _Optional[str] = ..., priority: _Optional[int] = ...) -> None: ...

class DeadLetterQueue(_message.Message):
    __slots__ = ("topic", "message_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    message_id: str
    def __init__(self, topic: _Optional[str] = ..., message_id: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("topic", "user_properties", "system_properties", "body")
    class UserPropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    USER_PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    topic: Resource
    user_properties: _containers.ScalarMap[str, str]
    system_properties: SystemProperties
    body: bytes
    def __init__(self, topic: _Optional[_Union[Resource, _Mapping]] = ..., user_properties: _Optional[_Mapping[str, str]] = ..., system_properties: _Optional[_Union[SystemProperties, _Mapping]] = ..., body: _Optional[bytes] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("message_queue",)
    MESSAGE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    message_queue: MessageQueue
    def __init__(self, message_queue: _Optional[_Union[MessageQueue, _Mapping]] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: Code
    message: str
    def __init__(self, code: _Optional[_Union[Code, str]] = ..., message: _Optional[str] = ...) -> None: ...

class UA(_message.Message):
    __slots__ = ("language", "version", "platform", "hostname")
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    language: Language
    version: str
    platform: str
    hostname: str
    def __init__(self, language: _Optional[_Union[Language, str]] = ..., version: _Optional[str] = ..., platform: _Optional[str] = ..., hostname: _Optional[str] = ...) -> None: ...

class Settings(_message.Message):
    __slots__ = ("client_type", "access_point", "backoff_policy", "request_timeout", "publishing", "subscription", "user_agent", "metric")
    CLIENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ACCESS_POINT_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_POLICY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    PUBLISHING_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    USER_AGENT_FIELD_NUMBER: _ClassVar[int]
    METRIC_FIELD_NUMBER: _ClassVar[int]
    client_type: ClientType
    access_point: Endpoints
    backoff_policy: RetryPolicy
    request_timeout: _duration_pb2.Duration
    publishing: Publishing
    subscription: Subscription
    user_agent: UA
    metric: Metric
    def __init__(self, client_type: _Optional[_Union[ClientType, str]] = ..., access_point: _Optional[_Union[Endpoints, _Mapping]] = ..., backoff_policy: _Optional[_Union[RetryPolicy, _Mapping]] = ..., request_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., publishing: _Optional[_Union[Publishing, _Mapping]] = ..., subscription: _Optional[_Union[Subscription, _Mapping]] = ..., user_agent: _Optional[_Union[UA, _Mapping]] = ..., metric: _Optional[_Union[Metric, _Mapping]] = ...) -> None: ...

class Publishing(_message.Message):
    __slots__ = ("topics", "max_body_size", "validate_message_type")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    MAX_BODY_SIZE_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[Resource]
    max_body_size: int
    validate_message_type: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[Resource, _Mapping]]] = ..., max_body_size: _Optional[int] = ..., validate_message_type: _Optional[bool] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("group", "subscriptions", "fifo", "receive_batch_size", "long_polling_timeout", "lite_subscription_quota", "max_lite_topic_size")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LONG_POLLING_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    LITE_SUBSCRIPTION_QUOTA_FIELD_NUMBER: _ClassVar[int]
    MAX_LITE_TOPIC_SIZE_FIELD_NUMBER: _ClassVar[int]
    group: Resource
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionEntry]
    fifo: bool
    receive_batch_size: int
    long_polling_timeout: _duration_pb2.Duration
    lite_subscription_quota: int
    max_lite_topic_size: int
    def __init__(self, group: _Optional[_Union[Resource, _Mapping]] = ..., subscriptions: _Optional[_Iterable[_Union[SubscriptionEntry, _Mapping]]] = ..., fifo: _Optional[bool] = ..., receive_batch_size: _Optional[int] = ..., long_polling_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lite_subscription_quota: _Optional[int] = ..., max_lite_topic_size: _Optional[int] = ...) -> None: ...

class Metric(_message.Message):
    __slots__ = ("on", "endpoints")
    ON_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    on: bool
    endpoints: Endpoints
    def __init__(self, on: _Optional[bool] = ..., endpoints: _Optional[_Union[Endpoints, _Mapping]] = ...) -> None: ...

class OffsetOption(_message.Message):
    __slots__ = ("policy", "offset", "tail_n", "timestamp")
    class Policy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        LAST: _ClassVar[OffsetOption.Policy]
        MIN: _ClassVar[OffsetOption.Policy]
        MAX: _ClassVar[OffsetOption.Policy]
    LAST: OffsetOption.Policy
    MIN: OffsetOption.Policy
    MAX: OffsetOption.Policy
    POLICY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TAIL_N_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    policy: OffsetOption.Policy
    offset: int
    tail_n: int
    timestamp: int
    def __init__(self, policy: _Optional[_Union[OffsetOption.Policy, str]] = ..., offset: _Optional[int] = ..., tail_n: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...
