"""Where the activity log's head goes as it moves: a file or stdout, and signed checkpoints.

:class:`Heads` writes the head (``ID:HASH``, a :class:`~bus.log.segments.Head`) every
``every_rows`` rows and ``every_seconds`` seconds, appending a line to a file or printing it, and
hands it to a :class:`HeadSink` (:class:`bus.log.checkpoints.Checkpointer` signs it). The I/O of
the chain lives here, so :mod:`bus.log.chain` only hashes and verifies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Any, Protocol

from .segments import Head

__all__ = ["HeadSink", "Heads"]


class HeadSink(Protocol):
    """Somewhere else the head goes as it moves: :class:`bus.log.checkpoints.Checkpointer` signs
    it."""

    def write(self, head: Head) -> None:
        """Record ``head``; raise :exc:`OSError` if it could not be (the next one is tried)."""

    def close(self) -> None:
        """Release what :meth:`write` opened."""


class Heads:
    """Where the log's head goes (``ID:HASH`` lines appended to a file, or stdout, and signed
    checkpoints through ``sink``) and when.

    :meth:`ship` and :meth:`close` run on the database thread, :meth:`start` and :meth:`stop`
    on the event loop.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | None,
        every_rows: int,
        every_seconds: float | None,
        sink: HeadSink | None = None,
    ) -> None:
        self.sink = sink
        """Where checkpoints go, if anywhere."""
        self.target = None if target is None else os.fspath(target)
        self.every_rows = max(1, every_rows)
        self.every_seconds = every_seconds
        self.rows = 0
        """Rows committed since the last head was written (database thread)."""
        self._last: Head | None = None
        self.ready = self.target != "-"
        """Whether heads may be written: stdout waits for :meth:`ActivityLog.release_heads`,
        so that ``bcpbus serve`` prints its ``listening on`` line first."""
        self._file: Any = None
        self._timer: asyncio.Task[None] | None = None

    def start(self, tick: Any) -> None:
        """Call ``tick`` every ``every_seconds`` until :meth:`stop`."""
        if (self.target is None and self.sink is None) or self.every_seconds is None:
            return
        every = self.every_seconds

        async def run() -> None:
            while True:
                await asyncio.sleep(every)
                tick()

        self._timer = asyncio.create_task(run(), name="activity-log head")

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def ship(self, head: Head | None) -> None:
        """Sign ``head`` and write it unless it was the last one written.

        Raises:
            OSError: a file cannot be written; the next head will be tried.
        """
        self.rows = 0
        if head is None:
            return
        failed: OSError | None = None
        if self.sink is not None:
            try:
                self.sink.write(head)
            except OSError as exc:  # the line below may still go out
                failed = exc
        if self.target is not None and head != self._last and self.ready:
            self._line(head)
        if failed is not None:
            raise failed

    def _line(self, head: Head) -> None:
        line = f"{head}\n"
        if self.target == "-":
            sys.stdout.write(line)
            sys.stdout.flush()
        else:
            if self._file is None:
                assert self.target is not None
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
                self._file = os.fdopen(os.open(self.target, flags, 0o600), "a", encoding="ascii")
            self._file.write(line)
            self._file.flush()
        self._last = head

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
