"""Frames written to one socket in the same pass of the event loop go out in one ``send()``.

websockets writes every frame to its transport at once, and asyncio's transport makes one
``send()`` system call per write while its buffer is empty: under load a peer's answers and
deliveries cost a system call each, the largest single share of the bus's CPU in a profile at
window 64. :class:`CoalescingTransport` stands in for the transport of one connection: the first
write of a pass goes out at once (a lone frame, as at window 1, waits for nothing), the ones after
it in the same pass are held and handed to the real transport joined, from a callback the loop
runs right after the pass. Wrap a connection with :func:`coalesce` once its handshake is done.

What it holds is bounded: past :data:`FLUSH_BYTES` it writes at once, so the transport's flow
control (``pause_writing`` past websockets' ``write_limit``) sees every byte as it did before.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["FLUSH_BYTES", "CoalescingTransport", "coalesce"]

FLUSH_BYTES = 16 * 1024
"""Bytes held before they are written at once; below websockets' 32 KiB ``write_limit``."""


class CoalescingTransport:
    """An :class:`asyncio.Transport` that writes what one pass of the loop wrote, joined.

    Every method but the writing ones goes to the wrapped transport unchanged; those that
    end or measure the stream (``write_eof``, ``close``, ``get_write_buffer_size``) see the
    bytes held first.

    Args:
        transport: the connection's transport.
    """

    __slots__ = ("_busy", "_held", "_loop", "_size", "transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._loop = asyncio.get_running_loop()
        self._busy = False
        self._held: list[bytes] = []
        self._size = 0

    def write(self, data: bytes) -> None:
        """Write ``data`` now if it is the first write of this pass of the loop, so that a lone
        frame waits for nothing; else hold it until the pass ends (or enough is held)."""
        if not self._busy:
            self._busy = True
            self._loop.call_soon(self.flush)
            self.transport.write(data)
            return
        self._held.append(data)
        self._size += len(data)
        if self._size >= FLUSH_BYTES:
            self._write_held()

    def flush(self) -> None:
        """The pass is over: write what is held, as one write."""
        self._busy = False
        self._write_held()

    def _write_held(self) -> None:
        held = self._held
        if not held:
            return
        self._held, self._size = [], 0
        if self.transport.is_closing():  # aborted or lost meanwhile: nobody to write to
            return
        self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def write_eof(self) -> None:
        self._write_held()
        self.transport.write_eof()

    def close(self) -> None:
        self._write_held()
        self.transport.close()

    def abort(self) -> None:
        self._held, self._size = [], 0
        self.transport.abort()

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + self._size

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def coalesce(connection: Any) -> None:
    """Make ``connection`` (a websockets connection whose handshake is done) coalesce the
    frames it writes in one pass of the loop; anything without a transport is left as it is."""
    transport = getattr(connection, "transport", None)
    if isinstance(transport, asyncio.Transport):
        connection.transport = CoalescingTransport(transport)
