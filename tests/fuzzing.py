"""Hypothesis strategies that build any protobuf request from its descriptor (shared by the proxy's and the
broker's fuzz tests), and the example count: ``POPGATE_FUZZ_EXAMPLES`` per test (50 in ``make test``, more in
``make fuzz``)."""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("POPGATE_FUZZ_EXAMPLES", "50"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

CASES: Counter[str] = Counter()  # generated cases sent, by surface and RPC (printed by report())


def report(surface: str) -> None:
    """Print the cases sent to one surface (stderr: shown by ``pytest -s``, as ``make fuzz`` runs)."""
    counts = {k: v for k, v in CASES.items() if k.startswith(surface)}
    print(f"\nfuzz cases {surface}: {sum(counts.values())} {dict(sorted(counts.items()))}", file=sys.stderr)


HANDLE = "1~b1~fuzz~0~0~1~ab~1700000000000"
TEXT = st.one_of(
    st.sampled_from(["", "fuzz", "g1", "*", "a||b", "%DLQ%g1", "b1", HANDLE, "x" * 200, "bad name", "\x00"]),
    st.text(max_size=40),
)
BYTES = st.one_of(st.binary(max_size=64), st.just(b"x" * (4 * 1024 * 1024 + 1)))
INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def values(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_MESSAGE:
        return messages(field.message_type, depth + 1)
    if kind == FieldDescriptor.TYPE_ENUM:
        return st.one_of(st.sampled_from([v.number for v in field.enum_type.values]), st.integers(-5, 70000))
    if kind == FieldDescriptor.TYPE_STRING:
        return TEXT
    if kind == FieldDescriptor.TYPE_BYTES:
        return BYTES
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(allow_nan=False, width=32)
    low, high = INT_RANGES.get(kind, (-(2**31), 2**31 - 1))
    return st.one_of(st.integers(max(low, -3), 40), st.integers(low, high))


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    if depth > 4:
        return st.just({})
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            optional[field.name] = st.dictionaries(TEXT, TEXT, max_size=3)
        elif field.is_repeated:  # type: ignore[attr-defined]
            optional[field.name] = st.lists(values(field, depth), max_size=3)
        else:
            optional[field.name] = values(field, depth)
    return st.fixed_dictionaries({}, optional=optional)  # type: ignore[arg-type]


def build(cls: type[Message], data: dict[str, Any]) -> Message:
    message = cls()
    for name, value in data.items():  # set one by one: later oneof members simply win
        field = cls.DESCRIPTOR.fields_by_name[name]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(message, name).update(value)
        elif field.is_repeated:  # type: ignore[attr-defined]
            if field.message_type is not None:
                for item in value:
                    getattr(message, name).append(build(GetMessageClass(field.message_type), item))
            else:
                getattr(message, name).extend(value)
        elif field.message_type is not None:
            getattr(message, name).CopyFrom(build(GetMessageClass(field.message_type), value))
        else:
            setattr(message, name, value)
    return message


def requests(cls: type[Message]) -> st.SearchStrategy[Message]:
    return messages(cls.DESCRIPTOR).map(lambda d: build(cls, d))
