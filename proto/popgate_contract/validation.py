"""Checks of names and message fields shared by every RPC (docs/ARCHITECTURE.md §5)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from popgate_contract.errors import (
    BadRequest,
    DomainError,
    IllegalFilter,
    IllegalGroup,
    IllegalMessage,
    IllegalMessageGroup,
    IllegalMessageKey,
    IllegalPropertyKey,
    IllegalTopic,
    MessagePropertiesTooLarge,
)

# The limits of docs/ARCHITECTURE.md §5, checked by the broker and again, before any broker call, by the proxy
# (proxy/validate.py imports them from here: one source for both).
NAME_RE = re.compile(r"[%a-zA-Z0-9_-]+")  # fullmatch: "$" would also match before a final newline
MAX_NAME_LEN = 127
DLQ_PREFIX = "%DLQ%"
# The properties a dead letter gets (broker/redelivery.py), which `popgate dlq resend` drops again.
DLQ_PROPS = ("ORIGIN_TOPIC", "ORIGIN_MESSAGE_ID", "DELIVERY_ATTEMPTS", "ORIGIN_QUEUE_ID", "ORIGIN_OFFSET")
# User property keys no producer may set: RocketMQ's system property names (MessageConst.STRING_HASH_SET, which its
# proxy refuses as "used by system") and the dead-letter bookkeeping above, which a dead letter would overwrite and a
# resend drop — tests/unit/broker/test_send_text.py::test_a_property_named_as_a_system_one_is_refused.
RESERVED_PROPERTY_KEYS = frozenset(
    (
        *DLQ_PROPS,
        *("TRACE_ON", "MSG_REGION", "KEYS", "TAGS", "WAIT", "DELAY", "RETRY_TOPIC", "REAL_TOPIC", "REAL_QID"),
        *("TRAN_MSG", "PGROUP", "MIN_OFFSET", "MAX_OFFSET", "BUYER_ID", "TRANSFER_FLAG", "CORRECTION_FLAG"),
        *("MQ2_FLAG", "RECONSUME_TIME", "UNIQ_KEY", "MAX_RECONSUME_TIMES", "CONSUME_START_TIME", "POP_CK"),
        *("POP_CK_OFFSET", "1ST_POP_TIME", "TRAN_PREPARED_QUEUE_OFFSET", "DUP_INFO", "EXTEND_UNIQ_INFO"),
        *("INSTANCE_ID", "CORRELATION_ID", "REPLY_TO_CLIENT", "TTL", "ARRIVE_TIME", "PUSH_REPLY_TIME", "CLUSTER"),
        *("MSG_TYPE", "INNER_MULTI_QUEUE_OFFSET", "TIMER_DELAY_MS", "TIMER_DELAY_SEC", "TIMER_DELIVER_MS"),
        *("TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_OUT_MS", "TIMER_DEL_UNIQKEY"),
        *("TIMER_DELAY_LEVEL", "__BORNHOST", "BORN_TIMESTAMP", "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "__CRC32#"),
    )
)
# The consumer group `popgate dlq resend` reads %DLQ%<group> with (by default): its backlog there is what is
# not yet re-sent, which is what the broker reports as a DLQ's size (broker/metrics.py, `popgate dlq list`).
DLQ_RESEND_GROUP = "popgate-dlq-resend"
MAX_TAG_LEN = 256
# A client's id (x-mq-client-id): the proxy refuses a longer one (proxy/v2/access.py), and a broker refuses a
# consumer report naming one (broker/consumers.py).
MAX_CLIENT_ID_CHARS = 512
MAX_MESSAGE_ID_LEN = 128
MAX_KEYS = 64
MAX_KEY_LEN = 256
# RocketMQ's proxy refuses a message group of maxMessageGroupSize (64) bytes or more.
MAX_MESSAGE_GROUP_BYTES = 63
# The UTF-8 bytes of a message's tag, keys and user property keys and values, counted together as RocketMQ's proxy
# counts them against maxUserPropertySize.
MAX_PROPERTIES_BYTES = 16 * 1024
MAX_PROPERTIES = 128
MAX_TRACE_CONTEXT_BYTES = 16 * 1024
# Receipt handles in one Ack or Renew: fixed, not --max-send-batch, as a proxy's AckMessage carries up to 1,024 and
# its renewals batch as many: a broker with a smaller send batch takes them all.
MAX_HANDLES = 1024
# Messages in one Send: fixed too, as a proxy sends a whole SendMessage (up to 1,024) to one broker in one Send
# (the bytes are bounded by --max-send-bytes).
MAX_SEND_MESSAGES = 1024


# ISO control characters (C0, DEL, C1): all RocketMQ's proxy refuses by character in a tag, key, message group or
# property key (GrpcValidator.containControlCharacter); other Unicode (NBSP, U+3000, ZWJ) is text — test_rules.py::
# test_unicode_text_other_than_control_characters_is_a_tag_key_message_group_or_property_key.
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def has_control(text: str) -> bool:
    return _CONTROL_RE.search(text) is not None


def check_name(kind: str, name: str, *, error: type[DomainError], limit: int = MAX_NAME_LEN) -> str:
    """`name` if it is a valid `kind` name ("topic", "consumer group") of at most `limit` characters."""
    if not name:
        raise error(f"{kind} name is empty")
    if len(name) > limit:
        raise error(f"{kind} name is {len(name)} characters long; the limit is {limit}")
    if not NAME_RE.fullmatch(name):
        raise error(f"{kind} name {name!r} may only contain letters, digits, %, _ and -")
    return name


def check_topic(topic: str) -> str:
    # A dead-letter topic is "%DLQ%" + a group name, so it may be 5 characters longer.
    limit = MAX_NAME_LEN + len(DLQ_PREFIX) if topic.startswith(DLQ_PREFIX) else MAX_NAME_LEN
    return check_name("topic", topic, error=IllegalTopic, limit=limit)


def check_group(group: str) -> str:
    return check_name("consumer group", group, error=IllegalGroup)


def check_tag(tag: str, *, error: type[DomainError] = IllegalMessage) -> str:
    """`tag` if a message may carry it (`error`: the class to raise, the proxy's finer one for its v2 code)."""
    if not tag.strip():
        raise error("message tag is blank")
    if len(tag) > MAX_TAG_LEN:
        raise error(f"message tag is {len(tag)} characters long; the limit is {MAX_TAG_LEN}")
    if "|" in tag or has_control(tag):
        raise error(f"message tag {tag!r} contains '|' or a control character")
    if tag != tag.strip():  # filters strip their tags: such a message could never be selected by its tag
        raise error(f"message tag {tag!r} starts or ends with whitespace")
    return tag


def check_message_id(message_id: str) -> str:
    """`message_id` if a message may carry it: empty (the broker assigns one) or up to MAX_MESSAGE_ID_LEN printable
    characters, not blank, as RocketMQ's proxy refuses a blank one — tests/unit/proxy/test_rules.py::
    test_a_blank_message_id_is_illegal_message_id_and_an_empty_one_is_left_to_the_broker."""
    if len(message_id) > MAX_MESSAGE_ID_LEN or not message_id.isprintable():
        raise IllegalMessage(f"message id must be at most {MAX_MESSAGE_ID_LEN} printable characters")
    if message_id and not message_id.strip():
        raise IllegalMessage("message id is blank")
    return message_id


def check_keys(keys: Sequence[str]) -> Sequence[str]:
    """`keys` if a message may carry them: at most MAX_KEYS, each 1..MAX_KEY_LEN characters, not blank, with no
    control character (tests/unit/proxy/test_rules.py, tests/unit/broker/test_send_text.py)."""
    if len(keys) > MAX_KEYS:
        raise IllegalMessageKey(f"message has {len(keys)} keys; the limit is {MAX_KEYS}")
    for key in keys:
        if not key.strip() or len(key) > MAX_KEY_LEN or has_control(key):
            raise IllegalMessageKey(f"message key {key[:40]!r} is blank, too long or has a control character")
    return keys


def check_message_group(value: str) -> str:
    """`value` if it is 1..MAX_MESSAGE_GROUP_BYTES bytes of UTF-8, not blank, with no control character."""
    size = len(value.encode())
    if not value.strip() or size > MAX_MESSAGE_GROUP_BYTES or has_control(value):
        raise IllegalMessageGroup(
            f"message group must be 1..{MAX_MESSAGE_GROUP_BYTES} bytes of text, not blank and with no control"
            f" character, got {size} bytes"
        )
    return value


def check_properties(props: Mapping[str, str], *, tag: str = "", keys: Sequence[str] = ()) -> Mapping[str, str]:
    """`props` if a message may carry them: at most MAX_PROPERTIES, no key blank or reserved and no control character
    in a key or a value, and, with the message's `tag` and `keys` (checked already), MAX_PROPERTIES_BYTES of UTF-8 in
    all, as RocketMQ's proxy refuses (tests/unit/proxy/test_rules.py, tests/unit/broker/test_send_text.py)."""
    if len(props) > MAX_PROPERTIES:
        raise MessagePropertiesTooLarge(f"message has {len(props)} user properties; the limit is {MAX_PROPERTIES}")
    size = len(tag.encode()) + sum(len(key.encode()) for key in keys)
    for key, value in props.items():
        if not key.strip() or has_control(key):
            raise IllegalPropertyKey(f"user property key {key[:40]!r} is blank or has a control character")
        if key in RESERVED_PROPERTY_KEYS:
            raise IllegalPropertyKey(f"user property key {key!r} is used by the system")
        if has_control(value):
            raise IllegalPropertyKey(f"the value of user property {key[:40]!r} has a control character")
        size += len(key.encode()) + len(value.encode())
    if size > MAX_PROPERTIES_BYTES:
        raise MessagePropertiesTooLarge(
            f"the tag, keys and user properties take {size} bytes; the limit is {MAX_PROPERTIES_BYTES} bytes"
        )
    return props


def check_trace_context(text: str) -> str:
    """`text` if a message may carry it as its trace context: at most MAX_TRACE_CONTEXT_BYTES of UTF-8 with no
    control character (RocketMQ's proxy stores it unchecked, as a property: its properties' separators are control
    characters) — tests/unit/proxy/test_rules.py::
    test_a_trace_context_may_be_any_text_of_up_to_16_kib_without_a_control_character."""
    size = len(text.encode())
    if size > MAX_TRACE_CONTEXT_BYTES or has_control(text):
        raise BadRequest(
            f"trace context must be at most {MAX_TRACE_CONTEXT_BYTES} bytes with no control character, got {size} bytes"
        )
    return text


MAX_FILTER_LEN = 1024


def split_tags(expression: str, *, max_len: int | None = MAX_FILTER_LEN) -> list[str] | None:
    """The tags of a filter expression, stripped, in their order (None: every message matches). Empty parts
    (``a||``, ``a|| ||b``) are skipped, as RocketMQ's FilterAPI skips them; an expression of empty parts only would
    select no message and is refused (tests/unit/broker/test_filters.py). `max_len`: the longest expression a
    client may send; None for one the store kept (see `TagFilter.parse`)."""
    text = expression.strip()
    if text in ("", "*"):
        return None
    if max_len is not None and len(text) > max_len:
        raise IllegalFilter(f"filter expression is {len(text)} characters long; the limit is {max_len}")
    tags = [tag for part in text.split("||") if (tag := part.strip())]
    if not tags:
        raise IllegalFilter(f"filter expression {expression!r} has no tag (use '*' for every message)")
    for tag in tags:
        if tag == "*" or "|" in tag or has_control(tag):
            raise IllegalFilter(f"filter expression {expression!r} has an invalid tag {tag!r}")
    return tags


class AddressError(ValueError):
    """An address is not ``HOST:PORT``; the message names what it was given for."""


def parse_host_port(text: str, *, what: str) -> tuple[str, int]:
    """(host, port) of a ``HOST:PORT`` address (``[::1]:80`` too); AddressError naming `what` otherwise."""
    host, sep, port = text.rpartition(":")
    if "://" in text:
        raise AddressError(f"{what}: {text!r} is not HOST:PORT (no scheme: drop {text.partition('://')[0]}://)")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise AddressError(f"{what}: {text!r} is not HOST:PORT (a port is 0..65535)")
    return host.strip("[]"), int(port)
