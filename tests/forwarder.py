"""A TCP forwarder on 127.0.0.1 for tests of slow or failing links (no mocks: real sockets both ways)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class Forwarder:
    """127.0.0.1:<port> → `target`; each connection silent for `delay_s` before bytes flow either way,
    `drop_answers` loses what the target sends for a while, then cuts every connection (a network blip), and
    `go_silent` makes every open connection dead without a word (no FIN, no RST) while new ones work."""

    def __init__(self, target: str, delay_s: float = 0.0) -> None:
        self.host, port = target.rsplit(":", 1)
        self.target_port = int(port)
        self.delay_s = delay_s
        self.writers: set[asyncio.StreamWriter] = set()
        self.dropping = False
        self.generation = 0  # of the connections made now
        self.live_from = 0  # connections of an older generation relay nothing (`go_silent`)
        self.closing = asyncio.Event()  # set by `close`
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        await asyncio.sleep(self.delay_s)
        up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        self.writers.add(up_writer)
        generation = self.generation
        await asyncio.gather(
            self._pipe(reader, up_writer, generation), self._pipe(up_reader, writer, generation, answers=True)
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, generation: int, *, answers: bool = False
    ) -> None:
        try:
            while data := await reader.read(65536):
                if generation < self.live_from:  # gone silent: nothing relayed, nothing closed, ever
                    await self.closing.wait()
                    return
                if answers and self.dropping:
                    continue
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    def drop_answers(self, for_s: float) -> None:
        """From now on lose what the target sends; after `for_s`, cut every connection (and forward again)."""

        def cut() -> None:
            for writer in self.writers:
                writer.close()
            self.writers.clear()
            self.dropping = False

        self.dropping = True
        self.loop.call_soon_threadsafe(self.loop.call_later, for_s, cut)

    def retarget(self, target: str) -> None:
        """Connections made from now on go to `target`; every one open now is cut (a proxy replaced behind its
        address)."""

        def switch() -> None:
            self.host, port = target.rsplit(":", 1)
            self.target_port = int(port)
            for writer in self.writers:
                writer.close()
            self.writers.clear()

        asyncio.run_coroutine_threadsafe(_call(switch), self.loop).result(timeout=5)

    def go_silent(self) -> None:
        """Every connection open now relays nothing more and is never closed (a NAT or firewall entry lost, a
        blackholed link: no FIN, no RST reaches either end); connections made from now on work."""

        def cut() -> None:
            self.generation += 1
            self.live_from = self.generation

        self.loop.call_soon_threadsafe(cut)

    def close(self) -> None:
        async def stop() -> None:
            self.closing.set()
            self.server.close()
            for writer in self.writers:
                writer.close()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _call(function: Callable[[], None]) -> None:
    function()
