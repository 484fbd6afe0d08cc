"""Print every field, enum value and RPC of apache.rocketmq.v2 as one sorted line each.

Usage: python describe.py ours|official. Run once per side, in separate processes (the
two sets of generated classes cannot share a descriptor pool); the test compares them.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any


def lines(modules: list[ModuleType]) -> list[str]:
    out: list[str] = []

    def message(d: Any) -> None:
        for f in d.fields:
            ref = (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type) else ""
            oneof = f.containing_oneof.name if f.containing_oneof else ""
            out.append(f"{d.full_name}.{f.name} = {f.number} type={f.type} repeated={f.is_repeated} {ref} {oneof}")
        for nested in d.nested_types:
            message(nested)
        for e in d.enum_types:
            enum(e)

    def enum(e: Any) -> None:
        out.extend(f"{e.full_name}.{v.name} = {v.number}" for v in e.values)

    for module in modules:
        file = module.DESCRIPTOR
        for d in file.message_types_by_name.values():
            message(d)
        for e in file.enum_types_by_name.values():
            enum(e)
        for s in file.services_by_name.values():
            for m in s.methods:
                out.append(
                    f"rpc {s.full_name}/{m.name}({m.input_type.full_name}) -> {m.output_type.full_name} "
                    f"client_stream={m.client_streaming} server_stream={m.server_streaming}"
                )
    return sorted(out)


if __name__ == "__main__":
    if sys.argv[1] == "ours":
        from popgate_pb.v2 import definition_pb2, service_pb2
    else:
        from rocketmq.grpc_protocol import definition_pb2, service_pb2  # type: ignore[no-redef]
    print("\n".join(lines([definition_pb2, service_pb2])))
