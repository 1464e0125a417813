"""Messages read back from the activity log by epoch: the I/O behind ``fetchMessages``.

Every message the bus accepts has a ``send_start`` row holding its epoch, topic, sender, the
sender's taint (``status``) and its envelope (``payload_json``); :mod:`bus.log.fetch` decides which
of them a peer may read. This module only reads them, in epoch order, through the partial
indexes of :data:`bus.log.schema.SCHEMA`: by epoch for a pattern, by topic then epoch for a
concrete topic. A message whose log failed before its delivery (a ``send_aborted`` row: its
sender got -32006) is never read back.

Reads run on a read-only connection on a thread of their own, opened at the first read. WAL lets
it read while the writer writes, so a fetch of thousands of rows delays neither the event loop
nor the log's commits (the writer's thread is not the one that reads). :meth:`History.fill`
also hands the rows to their :class:`Sink` there, which decodes and filters them: a page of
1,000 envelopes is some 15 ms of Python that would otherwise stall the loop::

    history = History(log.path)
    more = await history.fill(page, upto=epochs.last, topic=None)
    await history.close()
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .dbthread import DatabaseThread
from .schema import BUSY_TIMEOUT

__all__ = ["CHUNK_ROWS", "SCAN_ROWS", "History", "Sink", "StoredMessage"]

CHUNK_ROWS = 500
"""Log rows one query of :meth:`History.fill` reads at a time."""
SCAN_ROWS = 5_000
"""Log rows one :meth:`History.fill` looks at, at most, besides the page itself: a peer fetching
a rare topic over a long log gets ``more: true`` and a cursor to go on from, never a call that
scans the whole log."""

_COLUMNS = "epoch, ts, topic, actor, status, payload_json"
_NOT_ABORTED = (
    "NOT EXISTS (SELECT 1 FROM activity_log AS a"
    " WHERE a.event = 'send_aborted' AND a.epoch = m.epoch)"
)
_BY_EPOCH = (
    f"SELECT {_COLUMNS} FROM activity_log AS m"
    " WHERE m.event = 'send_start' AND m.epoch > ? AND m.epoch <= ?"
    f" AND {_NOT_ABORTED} ORDER BY m.epoch LIMIT ?"
)
_BY_TOPIC = (
    f"SELECT {_COLUMNS} FROM activity_log AS m"
    " WHERE m.event = 'send_start' AND m.topic = ? AND m.epoch > ? AND m.epoch <= ?"
    f" AND {_NOT_ABORTED} ORDER BY m.epoch LIMIT ?"
)
_OLDEST = "SELECT MIN(epoch) FROM activity_log WHERE event = 'send_start'"


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """One accepted message as its ``send_start`` row keeps it."""

    epoch: int
    ts: str
    """When the bus accepted it (the row's timestamp, ``2026-05-09T07:35:25.123456Z``)."""
    topic: str
    sender: str
    """The clientId that sent it, or ``system:bus`` for the bus's own."""
    mark: str | None
    """The sender's taint when it was accepted: ``taint:<level>`` or ``declassifier``."""
    payload_json: str | None
    """The envelope as JSON, or with ``log_content: digest`` its type and SHA-256."""


class Sink(Protocol):
    """What :meth:`History.fill` hands rows to (:class:`bus.log.fetch.Page`)."""

    cursor: int
    """The epoch of the last row it was given: where the next read starts."""
    limit: int
    """The most messages it takes."""

    def add(self, row: StoredMessage) -> bool:
        """Take the next row in epoch order; return whether it is full."""
        ...


class History:
    """Reads messages back from the activity log at ``path``; use one per bus.

    Args:
        path: the activity log's SQLite file (the bus's ``log.path``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._thread: DatabaseThread | None = None
        self._conn: sqlite3.Connection | None = None
        self._oldest: int | None = None
        self._lock = asyncio.Lock()  # one opening at a time
        self._closed = False

    async def fill(self, sink: Sink, *, upto: int, topic: str | None) -> bool:
        """Hand ``sink`` the messages after its cursor up to epoch ``upto``, oldest first, until
        it is full, they run out, or :data:`SCAN_ROWS` more rows were read.

        Args:
            topic: a concrete topic to read only its messages (through the topic index), or
                None for every topic.

        Returns:
            Whether rows are left after the sink's cursor.

        Raises:
            sqlite3.Error: the file cannot be read; the caller answers -32603.
            Exception: what ``sink.add`` raised.
        """
        thread = await self._open()
        return await thread.run(self._fill, sink, upto, topic)

    async def oldest(self) -> int | None:
        """The epoch of the oldest message kept, or None while there is none.

        Nothing is ever deleted from the log, so once known it is kept.
        """
        if self._oldest is None:
            thread = await self._open()
            [(oldest,)] = await thread.run(self._query, _OLDEST, ())
            self._oldest = oldest
        return self._oldest

    async def close(self) -> None:
        """Close the read connection and end its thread. Idempotent."""
        self._closed = True
        async with self._lock:
            if self._thread is not None:
                await self._thread.stop(self._disconnect)
                self._thread = None

    async def _open(self) -> DatabaseThread:
        async with self._lock:
            if self._closed:
                raise RuntimeError("the message history is closed")
            if self._thread is None:
                thread = DatabaseThread(f"activity-read {self.path}", after=_nothing)
                try:
                    await thread.run(self._connect)
                except BaseException:
                    await thread.stop(self._disconnect)
                    raise
                self._thread = thread
            return self._thread

    # On the read thread

    def _connect(self) -> None:
        # mode=ro: this connection never writes, whatever a bug would ask of it.
        conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
        self._conn = conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _query(self, sql: str, args: tuple[object, ...]) -> list[Any]:
        assert self._conn is not None
        return self._conn.execute(sql, args).fetchall()

    def _fill(self, sink: Sink, upto: int, topic: str | None) -> bool:
        budget = SCAN_ROWS + sink.limit
        while budget > 0:
            chunk = min(CHUNK_ROWS, budget)
            if topic is None:
                rows = self._query(_BY_EPOCH, (sink.cursor, upto, chunk))
            else:
                rows = self._query(_BY_TOPIC, (topic, sink.cursor, upto, chunk))
            budget -= len(rows)
            for index, row in enumerate(rows):
                if sink.add(StoredMessage(*row)):
                    return index + 1 < len(rows) or len(rows) == chunk
            if len(rows) < chunk:
                return False
        return True


def _nothing() -> None:
    """Nothing to do between reads (the writer's thread checkpoints; this one only reads)."""
