"""A TCP relay between a bus node and its NATS server that a test can hold.

While held, what the node sends reaches the server, but nothing the server sends reaches the
node: a message the node publishes is stored, but its answer (the PubAck) and the stream's
messages wait in the relay, as on a link that stalls one way. :meth:`Relay.release` lets them
through, in order, with nothing lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["Relay", "relay_to"]


class Relay:
    """Relays every connection made to :attr:`url` to the NATS server on ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def hold(self) -> None:
        """Stop passing on what the server sends (the node's publishes still reach it)."""
        self._flowing.clear()

    def release(self) -> None:
        """Pass on what the server sent meanwhile, then everything as it comes."""
        self._flowing.set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pump in list(self._pumps):
            pump.cancel()
        for pump in list(self._pumps):
            with contextlib.suppress(BaseException):
                await pump

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        for pump in (
            self._pump(reader, up_writer, None),
            self._pump(up_reader, writer, self._flowing),
        ):
            task = asyncio.ensure_future(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, gate: asyncio.Event | None
    ) -> None:
        """Copy ``source`` to ``sink``, each chunk once ``gate`` is open (None: always)."""
        try:
            while chunk := await source.read(65536):
                if gate is not None:
                    await gate.wait()
                sink.write(chunk)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            sink.close()


@asynccontextmanager
async def relay_to(target_port: int) -> AsyncIterator[Relay]:
    """A started :class:`Relay` to ``target_port``, closed on exit."""
    relay = Relay(target_port)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.close()
