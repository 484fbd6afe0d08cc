"""Checks of docs/ARCHITECTURE.md §5 on client input, before anything reaches a broker. Pure functions.

Each raises the proxy error whose v2 code matches the violation, with a message
that names the field, the value and the rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from popgate_contract import errors
from popgate_contract.validation import (
    DLQ_PREFIX,
    MAX_SEND_MESSAGES,
    check_group,
    check_keys,
    check_message_group,
    check_message_id,
    check_properties,
    check_tag,
    check_topic,
    check_trace_context,
    split_tags,
)

# A limit only the proxy checks (the broker knows no namespace).
NAMESPACE_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")


# The broker's own checks: the same names, limits and messages on both sides of a Send or a Pop.
topic = check_topic
group = check_group
message_id = check_message_id
message_group = check_message_group
properties = check_properties
trace_context = check_trace_context


# Topics no producer may send to (RocketMQ's TopicValidator.isSystemTopic, and its %-prefixed group topics):
# popgate's own dead-letter topics among them, whose messages `popgate dlq resend` delivers again.
SYSTEM_PREFIXES = ("%", "rmq_sys_", "RMQ_SYS_")
SYSTEM_TOPICS = frozenset({"TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC"})


def publish_topic(name: str) -> str:
    """`name` (a topic name already checked by `topic` / `topic_in`) if messages may be sent to it."""
    if name.startswith(SYSTEM_PREFIXES) or name in SYSTEM_TOPICS:
        raise errors.IllegalTopic(f"topic {name!r} is a system topic: messages cannot be sent to it")
    return name


# Namespaces (a v2 Resource's resource_namespace) as RocketMQ 5 keeps them: the broker stores `orders` of
# namespace `a` as `a%orders` (and a dead-letter topic `%DLQ%g` as `%DLQ%a%g`), so tenants that use the same
# names stay apart; a client sees its own names back (`outside`). Empty: the name as it is.


def _in(check: Callable[[str], str], kind: str, error: type[errors.DomainError], namespace: str, name: str) -> str:
    if not namespace:
        return check(name)
    check(name)  # the name alone first: its own message for an empty or malformed name
    if not NAMESPACE_RE.fullmatch(namespace):
        raise error(f"{kind} namespace {namespace!r} must be 1..64 letters, digits, _ or -")
    if name.startswith(DLQ_PREFIX):
        return check(f"{DLQ_PREFIX}{namespace}%{name[len(DLQ_PREFIX) :]}")
    return check(f"{namespace}%{name}")


def topic_in(namespace: str, name: str) -> str:
    """The stored name of topic `name` in `namespace`, checked."""
    return _in(topic, "topic", errors.IllegalTopic, namespace, name)


def group_in(namespace: str, name: str) -> str:
    """The stored name of consumer group `name` in `namespace`, checked."""
    return _in(group, "consumer group", errors.IllegalGroup, namespace, name)


def outside(namespace: str, stored: str) -> str:
    """A stored name as a client of `namespace` knows it (the inverse of `topic_in` / `group_in`)."""
    if not namespace:
        return stored
    if stored.startswith(f"{DLQ_PREFIX}{namespace}%"):
        return DLQ_PREFIX + stored[len(DLQ_PREFIX) + len(namespace) + 1 :]
    return stored[len(namespace) + 1 :] if stored.startswith(f"{namespace}%") else stored


def tag_filter(expression: str, *, is_sql: bool = False) -> str:
    """The broker's filter text ('*' or 'a||b') for a TAG expression."""
    if is_sql:
        raise errors.IllegalFilter("SQL92 filter expressions are not supported; use a TAG expression like 'a || b'")
    tags = split_tags(expression)
    return "*" if tags is None else "||".join(tags)


def send_count(count: int, *, what: str = "SendMessage") -> int:
    """A send's count of messages, taken from its length before any message is read (a SendShared's runs are counted
    by `shared_runs` first) — tests/unit/proxy/test_overload.py::
    test_a_send_of_too_many_messages_is_refused_by_its_count_before_they_are_read."""
    if not 1 <= count <= MAX_SEND_MESSAGES:
        raise errors.BadRequest(f"{what} carries {count} messages: must be 1..{MAX_SEND_MESSAGES}")
    return count


def shared_runs(count: int) -> int:
    """A SendShared's count of runs, before any run is read — tests/unit/proxy/test_send_shared.py::
    test_a_shared_send_of_too_many_runs_is_refused_before_they_are_read."""
    if count > MAX_SEND_MESSAGES:
        raise errors.BadRequest(f"SendShared carries {count} runs: at most {MAX_SEND_MESSAGES}, as many as messages")
    return count


def batch_size(size: int, *, limit: int) -> int:
    if not 1 <= size <= limit:
        raise errors.IllegalBatchSize(f"batch_size {size} is out of range: must be 1..{limit}")
    return size


def invisible(seconds: float, *, low: float, high: float, what: str = "invisible_duration") -> float:
    if not low <= seconds <= high:
        # .15g: 9.999999999 s is not shown as the 10 s it is refused against
        raise errors.IllegalInvisibleTime(f"{what} {seconds:.15g} s is out of range: must be {low:g} s..{high:g} s")
    return seconds


def body(data: bytes, *, limit: int) -> bytes:
    if not data:
        raise errors.MessageBodyEmpty("message body is empty")
    if len(data) > limit:
        raise errors.MessageBodyTooLarge(f"message body is {len(data)} bytes; the limit is {limit} bytes")
    return data


def tag(value: str) -> str:
    return check_tag(value, error=errors.IllegalMessageTag)


def keys(values: Iterable[str]) -> list[str]:
    out = list(values)
    check_keys(out)
    return out


def delivery_time(deliver_at_s: float, *, now_s: float, max_delay_s: float) -> float:
    """A delivery timestamp (seconds since the epoch); past times mean 'now'."""
    if deliver_at_s > now_s + max_delay_s:
        delay_s = deliver_at_s - now_s
        # A millisecond timestamp taken for seconds lands ~50,000 years ahead: only then say so.
        hint = " (it is seconds since the epoch, not milliseconds)" if delay_s > 1000 * now_s / 2 else ""
        raise errors.IllegalDeliveryTime(
            f"delivery_timestamp {deliver_at_s:.0f} is {delay_s:.0f} s ahead; the longest delay is "
            f"{max_delay_s:g} s{hint}"
        )
    return deliver_at_s
