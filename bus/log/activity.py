"""The append-only SQLite activity log: every protocol event, written in batches, one at a time.

Callers :meth:`ActivityLog.record` rows (synchronous, a tuple append) and
:meth:`~ActivityLog.commit` when they need them on disk before going on; the bus commits before
it answers each ``sendMessage``, so a message is never delivered without its audit row (fail
closed). Each batch is one ``INSERT`` statement, which SQLite runs as one transaction, however
many callers wait on it (group commit).

A commit is one hop: :meth:`~ActivityLog.commit` hands the pending rows to the database thread
itself (once the tasks ready in the same loop iteration have recorded theirs), and the thread
hands back a callback that releases the committers in the loop iteration that reads its
wake-up; the rows recorded while a batch is on the thread go in the next one, started by that
callback. Rows nobody commits (connection events) take the same path ``LINGER`` after the first
of them, or go with the next commit's batch. A writer task is there for the rest: a batch that
failed (retried, or split to isolate a row SQLite refuses), and the flush on close.

Every statement runs on one database thread (:class:`~bus.log.store.LogStore`, a plain
:mod:`sqlite3` connection, ``busy_timeout`` 5 s), never on the event loop's: a stalled disk (a
frozen filesystem, a lock another process holds) stalls the log's commits, not the loop, its
pings and the peers that are not waiting for the log. The thread gets one batch at a time and
rows recorded meanwhile form the next batch, so the cost is one round trip per transaction, not
per row.

Nothing one row holds can stop the rows after it. A batch that fails with an error that is not
worth retrying as is (:func:`~bus.log.store.retry_as_is`) is split in halves until the rows that
cannot be stored are alone; each is replaced by a ``row_unwritable`` row that keeps its
timestamp, the columns that are valid text, and the SHA-256 of the row
(:func:`~bus.log.rows.unwritable`), and the writer moves on. A row is only replaced when SQLite
refused it for what it holds (:func:`~bus.log.rows.refused_for_content`) and its replacement can
be written, so a database that refuses everything is reported as such
(:class:`~bus.core.errors.AuditUnavailable`), never papered over.

Before each batch's ``INSERT``, the thread checks that ``path`` still names the file it opened
(``os.stat``: device and inode). A deleted or replaced file would take every later row with it
while SQLite kept reporting success (and the rows would land in the WAL of the file that
replaced it), so from then on :meth:`~ActivityLog.commit` raises, nothing more is acknowledged,
and the error log says so once; the bus must be restarted.

The ``-wal`` file is kept small: SQLite's own passive checkpoint runs at ``checkpoint_bytes``
(16 MiB) of WAL, ``journal_size_limit`` cuts the file back to that size when the WAL restarts,
and every ``checkpoint_rows`` rows, once the batch's callers are answered, a ``TRUNCATE``
checkpoint with no busy wait empties it.

Timestamps are stamped when a row is recorded and never go backwards in row order (a clock
stepped back holds the last value until it catches up), so ``audit --since/--until`` find every
row.

The database itself refuses to change history, for every connection: triggers abort ``UPDATE``,
``DELETE``, and an ``INSERT`` that reuses an existing id (which is how ``INSERT OR REPLACE`` would
overwrite a row). Anyone who can write the file can still drop the triggers, so the log is also
evidence: each row's ``chain`` is a SHA-256 over the previous row's and its own content
(:mod:`bus.log.chain`), and signed checkpoints of the head vouch for it (:mod:`bus.log.checkpoints`,
through ``checkpoints``). The writer chains each batch on the event loop after the last row it
committed, with the ids that follow, and the thread inserts it in the one ``INSERT``; if another
process wrote a row meanwhile, the first id is taken, the ``activity_log_no_replace`` trigger
aborts the statement, and the thread chains the batch again after the rows it finds, in a
``BEGIN IMMEDIATE`` transaction. So several processes writing one file chain their rows in turn.

Opening the log creates the file 0600, migrates its schema, checks its triggers and the tail of
its chain (:mod:`bus.log.logfile`). Every ``head_every_rows`` rows and ``head_every_seconds``
seconds the writer can append the head (``ID:HASH`` of the last row) to a file or stdout, for
shipping where the database's owner cannot rewrite it; ``bcpbus audit verify --expect-head``
then catches rows cut from the end.

Several processes may write one file (WAL mode, ``busy_timeout``). Read it with plain SQL or with
:mod:`bus.log.audit`.

What each of these choices costs, and what the alternatives cost, was measured: the figures are
in bench/README.md, "The activity log's design in figures".
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from ..core.errors import AuditUnavailable
from ..core.logevents import LogEvent
from .chain_v1 import default_key_path
from .dbthread import DatabaseThread
from .heads import Heads, HeadSink
from .rows import LogRow, encode_payload, stamp
from .schema import max_rows_per_statement, statement_rows
from .segments import Head
from .store import LogStore
from .writer import LINGER, Writer

__all__ = [
    "CHECKPOINT_BYTES",
    "CHECKPOINT_ROWS",
    "HEAD_EVERY_ROWS",
    "HEAD_EVERY_SECONDS",
    "LINGER",
    "ActivityLog",
]

logger = logging.getLogger("bus.log.activity")

CHECKPOINT_ROWS = 20_000
"""Rows committed between two checkpoints that empty the ``-wal`` file (``TRUNCATE``)."""

CHECKPOINT_BYTES = 16 * 1024 * 1024
"""Size of the WAL at which SQLite checkpoints it on its own, and to which the ``-wal`` file is cut
back when the WAL restarts: the WAL grows by pages, not rows (a transaction of 4 rows writes
about 6 pages), so the row count alone does not bound it."""

HEAD_EVERY_ROWS = 1000
"""Rows committed between two heads written (``head=``)."""

HEAD_EVERY_SECONDS = 10.0
"""Most seconds a new head waits to be written (``head=``)."""


class ActivityLog(Writer):
    """The activity log writer: buffer rows, write them in batches, report commits.

    Use it as ``async with ActivityLog(path) as log:`` or call :meth:`open` and :meth:`close`.

    Args:
        path: the SQLite file; created with its schema if missing.
        batch_max: most rows written in one transaction, rounded down to 3 significant bits
            (896 for 1,000); more pending rows take several. Also capped by SQLite's
            bound-parameter limit (3640 rows on SQLite 3.32 or later).
        retries: how many times a batch is attempted before its waiters get
            :class:`~bus.core.errors.AuditUnavailable`.
        retry_delay: seconds before the second attempt, doubling for each further one.
        queue_max: most rows held in memory waiting for the disk; past it :meth:`record` raises
            :class:`~bus.core.errors.AuditUnavailable` rather than drop anything.
        checkpoint_rows: rows committed between two checkpoints that empty the ``-wal`` file,
            run on the database thread after the batch's callers are answered.
        checkpoint_bytes: size of the WAL at which SQLite checkpoints it (passively, at the end
            of the commit that reaches it) and to which the ``-wal`` file is cut back when it
            restarts; ``None`` leaves checkpoints to ``checkpoint_rows`` alone.
        key_file: the key of a log an earlier version chained (version 1, an HMAC); ``None``
            for ``<path>.key``. Read only to check such a log before it is chained on.
        accept_broken: open a log whose chain or triggers show a change anyway: record the
            first bad row in a ``chain_start`` row that starts a new segment.
        head: where to append the head (``ID:HASH``), a file or ``"-"`` for stdout; ``None``
            for nowhere.
        head_every_rows: rows between two heads written.
        head_every_seconds: most seconds a new head waits to be written; ``None`` for no timer.
        checkpoints: where the head is signed and sent as well, as often (a
            :class:`~bus.log.checkpoints.Checkpointer`); ``None`` for nowhere.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        # Batching
        batch_max: int = 1000,
        # Failure handling
        retries: int = 3,
        retry_delay: float = 0.05,
        # Limits
        queue_max: int = 100_000,
        checkpoint_rows: int = CHECKPOINT_ROWS,
        checkpoint_bytes: int | None = CHECKPOINT_BYTES,
        # The chain
        key_file: str | os.PathLike[str] | None = None,
        accept_broken: bool = False,
        head: str | os.PathLike[str] | None = None,
        head_every_rows: int = HEAD_EVERY_ROWS,
        head_every_seconds: float | None = HEAD_EVERY_SECONDS,
        checkpoints: HeadSink | None = None,
    ) -> None:
        self.path = Path(path)
        """The SQLite file."""
        self.queue_max = queue_max
        self.on_record: Callable[[str, str | None, str | None, Any], None] | None = None
        """Told ``(event, topic, status, payload)`` of every row recorded, as it is recorded
        (:mod:`bus.ops.metrics` counts messages, errors and bits charged this way)."""
        self.on_commit: Callable[[float], None] | None = None
        """Told how many seconds each :meth:`commit` that had to wait waited."""
        store = LogStore(
            self.path,
            key_file=Path(key_file) if key_file is not None else default_key_path(self.path),
            accept_broken=accept_broken,
            checkpoint_rows=checkpoint_rows,
            checkpoint_bytes=checkpoint_bytes,
            heads=Heads(head, head_every_rows, head_every_seconds, checkpoints),
        )
        super().__init__(store, batch_max=batch_max, retries=retries, retry_delay=retry_delay)

    # What the file holds

    @property
    def head(self) -> Head | None:
        """The id and ``chain`` of the last row this log committed (or found on opening)."""
        return self._store.head

    @property
    def started(self) -> str | None:
        """The ``status`` of the ``chain_start`` row opening wrote, or None if it wrote none."""
        return self._store.started

    @property
    def last_epoch(self) -> int:
        """The highest message epoch in the file when it was opened (0 for none): the bus
        gives the next message a higher one (:mod:`bus.core.epochs`)."""
        return self._store.last_epoch

    @property
    def checkpoints(self) -> int:
        """WAL checkpoints that completed (the WAL truncated) so far by this instance."""
        return self._store.checkpoints

    @property
    def key_file(self) -> Path:
        """The chain's key file (a version-1 log's; read only to check it)."""
        return self._store.key_file

    # Lifecycle

    async def open(self) -> None:
        """Open (or create) the database and start the writer task.

        Raises:
            sqlite3.Error: the file cannot be opened or is not a database; fix the path or its
                permissions, since nothing can be logged (and so nothing delivered) without it.
            ChainBroken: the chain's tail or the triggers show a change (the message names the
                first bad row), or the key is missing for a chained log; a ``ValueError``.
            ValueError: the key file does not hold a key.
            RuntimeError: the log was already opened.
        """
        if self._thread is not None or self._closing:
            raise RuntimeError("the activity log was already opened")
        thread = DatabaseThread(f"activity-db {self.path}", after=self._store.after_batch)
        self._thread = thread
        try:
            await thread.run(self._store.connect, stamp())
        except BaseException:
            await thread.stop(self._store.disconnect)
            self._thread = None
            raise
        # A size _statement_rows() keeps: no batch's statement is then padded past the limit.
        most = min(self.batch_max, max_rows_per_statement())
        self._rows_per_statement = statement_rows(most, up=False)
        self._writer = asyncio.create_task(self._run(), name=f"activity-writer {self.path}")
        self._writer.add_done_callback(self._writer_done)
        self._store.heads.start(self._ship_head_later)
        # Sign the head as found and checked: a checkpoint vouches for the log from the start.
        await thread.run(self._store.ship_head)
        logger.info("activity log open: %s", self.path)

    async def close(self) -> None:
        """Flush every recorded row, stop the writer, close the database. Idempotent.

        Raises:
            AuditUnavailable: some rows could not be written; they are lost with this process,
                and the error log says how many. Only the first call raises.
        """
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        try:
            if self._writer is not None:
                self._wakeup.set()
                # wait() rather than await: a writer that was cancelled must not cancel us.
                await asyncio.wait({self._writer})
        finally:
            self._store.heads.stop()
            if self._thread is not None:
                await self._thread.stop(self._store.disconnect)
            self._closed.set()
        if self._pending:
            logger.error("activity log closed with %d rows unwritten", len(self._pending))
            raise AuditUnavailable(f"activity log closed with {len(self._pending)} rows unwritten")
        logger.info("activity log closed: %s", self.path)

    async def __aenter__(self) -> ActivityLog:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def release_heads(self) -> None:
        """Let heads go to stdout (``head="-"``) from now on; until then none is written there.

        ``bcpbus serve`` calls it once it has printed its ``listening on`` line.
        """
        self._store.heads.ready = True

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called; a closed log takes no more rows."""
        return self._closing

    # Writing

    def record(
        self,
        event: LogEvent,
        *,
        message_id: str | None = None,
        rpc_id: str | int | None = None,
        actor: str | None = None,
        topic: str | None = None,
        status: str | None = None,
        payload: Any = None,
        error: str | None = None,
        payload_json: str | None = None,
        epoch: int | None = None,
        trace_id: str | None = None,
    ) -> None:
        """Buffer one row, stamped now, for the writer. Never waits.

        The row is on disk once a later :meth:`commit` returns: await that before acting on
        anything that must be audited first. Each argument fills the column of its name
        (:class:`~bus.log.rows.LogRow` says what each holds); ``payload``, anything JSON can
        represent, fills ``payload_json`` (a value JSON can't, NaN or a cycle, as the JSON string
        of its ``repr`` rather than lost), unless the caller encoded it already.

        Raises:
            AuditUnavailable: the log is closed, or ``queue_max`` rows are already waiting for
                the disk; refuse the request that wanted this row.
        """
        if self._closing or len(self._pending) >= self.queue_max:
            raise self._refusal()
        # Plain str or None throughout, the event as its member's value (LogRow says why).
        self._pending.append(
            LogRow(
                stamp(),
                event._value_,
                message_id,
                None if rpc_id is None else str(rpc_id),
                actor,
                topic,
                status,
                payload_json if payload is None else encode_payload(payload),
                error,
                None if epoch is None else str(epoch),
                trace_id,
            )
        )
        self._rows_recorded += 1
        if self.on_record is not None:
            self.on_record(event, topic, status, payload)
        if self._linger is None:  # checked here too: this line runs for every row
            self._linger_soon()

    def _refusal(self) -> AuditUnavailable:
        """Why :meth:`record` refuses a row: the log is closed, or its backlog is full."""
        if self._closing:
            return AuditUnavailable("activity log is closed")
        return AuditUnavailable(f"activity log backlog is full ({self.queue_max} rows)")

    async def commit(self) -> None:
        """Return once every row recorded before this call is committed.

        Concurrent callers share one transaction. The wait is bounded: at most ``retries``
        attempts, each bounded by SQLite's 5 s busy timeout.

        Raises:
            AuditUnavailable: the rows could not be written after ``retries`` attempts, the log
                closed first, or its file was deleted or replaced (for good: the bus must be
                restarted). Do not carry out what they record; the rows stay buffered and are
                retried with the next batch.
            RuntimeError: the log was never opened.
        """
        target = self._rows_recorded
        if self.rows_committed >= target:
            return
        if self._writer is None:
            raise RuntimeError("call ActivityLog.open() before commit()")
        if self._unavailable is not None:
            raise AuditUnavailable(self._unavailable)
        if self._writer.done():
            raise AuditUnavailable("activity log is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters.append((target, future))
        self._hand_over_soon()
        observe = self.on_commit
        if observe is None:
            await future
            return
        started = loop.time()
        try:
            await future
        finally:
            observe(loop.time() - started)

    async def write(self, event: LogEvent, **fields: Any) -> None:
        """:meth:`record` one row and :meth:`commit` it; the arguments are :meth:`record`'s.

        Raises:
            AuditUnavailable: as for :meth:`record` and :meth:`commit`.
        """
        self.record(event, **fields)
        await self.commit()

    def _ship_head_later(self) -> None:
        """The timer's turn (event loop): write the head on the thread if it moved."""
        if self._thread is not None and not self._closing:
            self._thread.run(self._store.ship_head)
