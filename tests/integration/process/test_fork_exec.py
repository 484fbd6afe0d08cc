"""Children started from a popgate program (the `popgate` command's cluster, a test run's Spark JVM) exec, however
busy its gRPC channels are: a child forked with a preexec_fn must not die on grpc's fork handlers first."""

from __future__ import annotations

import subprocess
import sys
import textwrap

FORKS = 800  # each fork a chance of the abort: 3 of 400 died without the setting (grpcio 1.85.1)

PROGRAM = textwrap.dedent(
    f"""
    import asyncio, subprocess, sys
    import broker  # a popgate program: its package chooses grpc's settings before grpc is imported
    import grpc

    async def main() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")  # nothing listens: it keeps trying to connect
        died = 0
        for _ in range({FORKS}):
            try:
                await asyncio.wait_for(channel.channel_ready(), 0.001)
            except (TimeoutError, grpc.RpcError):
                pass
            child = subprocess.run(["true"], preexec_fn=lambda: None, capture_output=True)
            died += child.returncode != 0
        await channel.close()
        print(died)

    asyncio.run(main())
    """
)


def test_children_forked_beside_live_grpc_channels_all_exec() -> None:
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0", done.stderr[-2000:]
