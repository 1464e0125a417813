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
callback. A writer task is there for what no commit asks for: rows nobody
commits (connection events, written ``LINGER`` after the first of them), a batch that failed
(retried, or split to isolate a row SQLite refuses), and the flush on close. Before, every commit
went through that task: one loop iteration more at each end, the task woken, then woken again
by the thread's future (figures in bench/README.md, "One hop per commit").

Every statement runs on one database thread (a plain :mod:`sqlite3` connection, ``busy_timeout``
5 s), never on the event loop's: a stalled disk (a frozen filesystem, a lock another process
holds) stalls the log's commits, not the loop, its pings and the peers that are not waiting for
the log. The thread gets one batch at a time and rows recorded meanwhile form the next batch,
so the cost is one round trip per transaction, not per row: 24 µs of CPU on a 2-core
VM, the same as through :mod:`aiosqlite`'s thread (24-26 µs both); a thread of its own lets the
file check, the ``INSERT`` and the checkpoint share that one round trip. Against the ``INSERT``
on the loop's thread it replaces (``python -m bench log``, interleaved): a lone caller's 4-row
commits cost 24 µs more CPU each (22.6 against 16.6 µs a row; 0.63x commits a second), 64
callers sharing transactions 2% more (5.5 against 5.4 µs a row); the bus, about 1.4x CPU per
message at window 1 and the same at window 64.

Nothing one row holds can stop the rows after it. A batch that fails with an error that is not
worth retrying as is (see :func:`_retry_as_is`) is split in halves until the rows that cannot be
stored are alone; each is replaced by a ``row_unwritable`` row that keeps its timestamp, the
columns that are valid text, and the SHA-256 of the row (:func:`_unwritable`), and the writer
moves on. A row is only replaced when SQLite refused it for what it holds
(:func:`_refused_for_content`) and its replacement can be written, so a database that refuses
everything is reported as such (:class:`~bus.core.errors.AuditUnavailable`), never papered over.

Before each batch's ``INSERT``, the thread checks that ``path`` still names the file it opened
(``os.stat``: device and inode, 2 µs). A deleted or replaced file would take every later row with
it while SQLite kept reporting success (and the rows would land in the WAL of the file that
replaced it), so from then on :meth:`~ActivityLog.commit` raises, nothing more is acknowledged,
and the error log says so once; the bus must be restarted.

The ``-wal`` file is kept small. With checkpoints only every 20,000 rows, passive and on
another connection, it only grew: 239 MiB of WAL for the 40,000 rows of 10,000 messages
committed one at a time (each 4-row transaction writes about 6 pages), 31 times the database.
Now SQLite's own passive checkpoint runs at ``checkpoint_bytes`` (16 MiB) of WAL, on the
database thread at the end of the commit that reaches it, and never waits for readers;
``journal_size_limit`` cuts the file back to that size when the WAL restarts; and every
``checkpoint_rows`` rows, once the batch's callers are answered, a ``TRUNCATE`` checkpoint with
no busy wait empties it (a reader holding an old snapshot makes it copy what it can and report
busy; the next one tries again). The largest ``-wal`` is then 16.1 MiB for those 40,000 rows and
16.6 MiB for 200,000 rows in 256-row transactions (401 MiB before). The commit that reaches the
threshold waits for the checkpoint: ``commit()`` p99 with 64 callers is 16 ms (4 ms before).
4 MiB would keep the file smaller but cost the bus a third more CPU per message at window 1
(500 against 372 µs, interleaved); ``TRUNCATE`` at every 4 MiB instead of SQLite's checkpoint
cost a lone caller a third of its commits (4,800 against 7,600 a second), presumably as the
emptied file has to be grown again rather than written over.

Timestamps are stamped when a row is recorded and never go backwards in row order (a clock
stepped back holds the last value until it catches up), so ``audit --since/--until`` find every
row.

The database itself refuses to change history, for every connection: triggers abort ``UPDATE``,
``DELETE``, and an ``INSERT`` that reuses an existing id (which is how ``INSERT OR REPLACE`` would
overwrite a row). Anyone who can write the file can still drop the triggers, so the log is also
evidence: each row's ``chain`` is a SHA-256 over the previous row's and its own content
(:mod:`bus.log.chain`), and signed checkpoints of the head vouch for it (:mod:`bus.log.checkpoints`,
through ``checkpoints``). The writer chains each batch after
the last row it committed, with the ids that follow, as it hands the batch to the database
thread, and the thread inserts it in the one ``INSERT`` as before; if another process wrote a
row meanwhile, the first id is taken, the ``activity_log_no_replace`` trigger aborts the
statement, and the thread chains the batch again after the rows it finds, in a ``BEGIN
IMMEDIATE`` transaction. So several processes writing one file chain their rows in turn, and the
bus pays a hash and a 2 µs encoding per row. Where it pays them was measured (with version 1's
HMAC; ``python -m bench.ab``, window 64, against the log without a chain): on the database
thread, the bus lost a quarter of its messages/s (0.75x, CPU 1.21x): that thread had to take the
GIL from the busy event loop for the work, before and after the ``INSERT``; on the loop, 0.91x
(CPU 1.10x). Four
statements per batch instead of one (``BEGIN IMMEDIATE``, ``SELECT`` the last row, ``INSERT``,
``COMMIT``) had cost another third.

Opening the log creates the file 0600, migrates its schema, checks its triggers and the tail of
its chain (:mod:`bus.log.logfile`). Every ``head_every_rows`` rows and ``head_every_seconds``
seconds
the writer can append the head (``ID:HASH`` of the last row) to a file or stdout, for shipping
where the database's owner cannot rewrite it; ``bcpbus audit verify --expect-head`` then catches
rows cut from the end.

Several processes may write one file (WAL mode, ``busy_timeout``). Read it with plain SQL or with
:mod:`bus.log.audit`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from ..core.errors import AuditUnavailable
from ..core.logevents import LogEvent
from .chain import Chainer, Heads, HeadSink, Verifier
from .chain_v1 import default_key_path
from .dbthread import DatabaseThread
from .logfile import create_file, prepare, scan

__all__ = [
    "COLUMNS",
    "LINGER",
    "SCHEMA",
    "ActivityLog",
    "canonical_json",
    "canonical_sha256",
]

logger = logging.getLogger("bus.log.activity")

COLUMNS: tuple[str, ...] = (
    "ts",
    "event",
    "message_id",
    "rpc_id",
    "actor",
    "topic",
    "status",
    "payload_json",
    "error",
    # Per message: its epoch (every row of it) and the trace id of its traceparent.
    "epoch",
    "trace_id",
)
"""The columns :meth:`ActivityLog.record` fills, in the order of each buffered row (``id`` is
assigned by SQLite)."""

_APPEND_ONLY = "activity_log is append-only"


LINGER = 0.05
"""Seconds a recorded row may wait for a transaction when no caller commits it."""

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

BUSY_TIMEOUT = 5.0
"""Seconds a write waits (on the database thread) for another process's lock."""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS activity_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts TEXT NOT NULL,
    event TEXT NOT NULL,
    message_id TEXT,
    rpc_id TEXT,
    actor TEXT,
    topic TEXT,
    status TEXT,
    payload_json TEXT,
    error TEXT,
    chain TEXT,
    epoch INTEGER,
    trace_id TEXT
);
CREATE INDEX IF NOT EXISTS idx_activity_message_id ON activity_log(message_id);
CREATE INDEX IF NOT EXISTS idx_activity_ts ON activity_log(ts);
-- What fetchMessages reads through (bus.log.history): messages by epoch, by topic then epoch, and
-- the few refused after their epoch was given. Partial: one entry per message, not per row.
CREATE INDEX IF NOT EXISTS idx_activity_epoch ON activity_log(epoch) WHERE event = 'send_start';
CREATE INDEX IF NOT EXISTS idx_activity_topic_epoch ON activity_log(topic, epoch)
WHERE event = 'send_start';
CREATE INDEX IF NOT EXISTS idx_activity_aborted ON activity_log(epoch)
WHERE event = 'send_aborted';
CREATE TRIGGER IF NOT EXISTS activity_log_no_update BEFORE UPDATE ON activity_log
BEGIN
    SELECT RAISE(ABORT, '{_APPEND_ONLY}');
END;
CREATE TRIGGER IF NOT EXISTS activity_log_no_delete BEFORE DELETE ON activity_log
BEGIN
    SELECT RAISE(ABORT, '{_APPEND_ONLY}');
END;
-- REPLACE deletes the old row without firing delete triggers (unless recursive_triggers is on),
-- so refuse any insert that reuses an existing id before the conflict is resolved.
CREATE TRIGGER IF NOT EXISTS activity_log_no_replace BEFORE INSERT ON activity_log
WHEN EXISTS (SELECT 1 FROM activity_log WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, '{_APPEND_ONLY}');
END;
"""
"""The table, its indexes and its triggers. :meth:`ActivityLog.open` creates what is missing and
adds a column a file lacks (a new column must take NULL and have no default, so that the rows
written before it keep their hash), but never creates a dropped trigger again without
``accept_broken``; see :mod:`bus.log.logfile`."""

_Row = tuple[str | None, ...]


class _FileGone(Exception):
    """The file at the log's path is not the one its connection writes (database thread)."""


class ActivityLog:
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
        self.batch_max = batch_max
        self.retries = max(1, retries)
        self.retry_delay = retry_delay
        self.queue_max = queue_max
        self.checkpoint_rows = checkpoint_rows
        self.checkpoint_bytes = checkpoint_bytes
        self.checkpoints = 0
        """WAL checkpoints that completed (the WAL truncated) so far by this instance."""
        self.batches_committed = 0
        """Transactions committed so far; fewer than :meth:`commit` calls when they were grouped."""
        self.rows_committed = 0
        """Rows committed so far by this instance, ``row_unwritable`` replacements included."""
        self.rows_unwritable = 0
        """Rows replaced by a ``row_unwritable`` row so far."""
        self.last_epoch = 0
        """The highest message epoch in the file when it was opened (0 for none): the bus
        gives the next message a higher one (:mod:`bus.core.epochs`)."""
        self.key_file = Path(key_file) if key_file is not None else default_key_path(self.path)
        """The chain's key file."""
        self.accept_broken = accept_broken
        self.started: str | None = None
        """The ``status`` of the ``chain_start`` row opening wrote, or None if it wrote none."""
        self._heads = Heads(head, head_every_rows, head_every_seconds, checkpoints)
        self.on_record: Callable[[str, str | None, str | None, Any], None] | None = None
        """Told ``(event, topic, status, payload)`` of every row recorded, as it is recorded
        (:mod:`bus.ops.metrics` counts messages, errors and bits charged this way)."""
        self.on_commit: Callable[[float], None] | None = None
        """Told how many seconds each :meth:`commit` that had to wait waited."""

        # Rows recorded and not yet committed, oldest first. A batch is a prefix of it and leaves
        # only once committed, so a failed batch is retried with the next one, in order.
        self._pending: list[_Row] = []
        self._rows_recorded = 0
        # commit() callers as (rows they wait for, future), in call order, so the targets grow.
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._wakeup = asyncio.Event()
        # Wakes the writer for rows nobody commits (connection events), LINGER seconds after
        # the first of them; commit() wakes it at once. Waking it on every record() would start
        # a transaction for the first row of each message and another for the rest.
        self._linger: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        # The batch commit() handed to the database thread itself, if one is there: at most one
        # batch is on the thread at a time, however it was started (see _hand_over).
        self._inflight: asyncio.Future[None] | None = None
        # The writer task is retrying, splitting or flushing: commit() leaves batches to it.
        self._draining = False
        self._hand_over_due = False  # _hand_over is scheduled
        # Why the last batch commit() handed over failed; the writer task takes it from there.
        self._handed_failure: Exception | None = None
        self._rows_per_statement = batch_max
        self._closing = False
        self._closed = asyncio.Event()
        # Why the log stopped for good (its file deleted or replaced); None while it works.
        self._unavailable: str | None = None

        # The database thread and what only it touches.
        self._thread: DatabaseThread | None = None
        self._conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the file opened
        self._rows_since_checkpoint = 0
        self._chainer: Chainer | None = None
        # The INSERT parameters and head of the batch about to be written, chained on the loop.
        self._prepared: tuple[list[_Row], list[Any], int, str] | None = None
        self.head: tuple[int, str] | None = None
        """The id and ``chain`` of the last row this log committed (or found on opening)."""

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
        thread = DatabaseThread(f"activity-db {self.path}", after=self._after_batch)
        self._thread = thread
        try:
            await thread.run(self._connect, _now())
        except BaseException:
            await thread.stop(self._disconnect)
            self._thread = None
            raise
        # A size _statement_rows() keeps: no batch's statement is then padded past the limit.
        most = min(self.batch_max, _max_rows_per_statement())
        self._rows_per_statement = _statement_rows(most, up=False)
        self._writer = asyncio.create_task(self._run(), name=f"activity-writer {self.path}")
        self._writer.add_done_callback(self._writer_done)
        self._heads.start(self._ship_head_later)
        # Sign the head as found and checked: a checkpoint vouches for the log from the start.
        await thread.run(self._ship_head)
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
            self._heads.stop()
            if self._thread is not None:
                await self._thread.stop(self._disconnect)
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
        self._heads.ready = True

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

        The row is on disk only once a later :meth:`commit` returns; await that before acting on
        anything that must be audited first.

        Args:
            event: what happened; :class:`~bus.core.logevents.LogEvent` says what each row holds.
            payload: anything JSON can represent; stored as ``payload_json``. A value it can't
                (NaN, a cycle) is stored as the JSON string of its ``repr`` rather than lost.
            rpc_id: the JSON-RPC id; stored as text.
            payload_json: the payload already encoded as JSON, instead of ``payload``, for a
                caller that stores the same payload many times.
            epoch: the epoch of the message the row is about.
            trace_id: the trace id of that message's ``traceparent``.

        Raises:
            AuditUnavailable: the log is closed, or ``queue_max`` rows are already waiting for
                the disk; refuse the request that wanted this row.
        """
        if self._closing:
            raise AuditUnavailable("activity log is closed")
        if len(self._pending) >= self.queue_max:
            raise AuditUnavailable(f"activity log backlog is full ({self.queue_max} rows)")
        self._pending.append(
            (
                _now(),
                # The member's plain str: SQLite binds it without adapting a subclass, and the
                # chain's encoding keeps to its all-text path.
                event._value_,
                message_id,
                None if rpc_id is None else str(rpc_id),
                actor,
                topic,
                status,
                payload_json if payload is None else _payload_json(payload),
                error,
                # As decimal text, like rpc_id: the column's INTEGER affinity stores it as an
                # integer, and the chain encodes an integer as this same text (bus.log.chain), so
                # every row stays on encode_row's all-text path.
                None if epoch is None else str(epoch),
                trace_id,
            )
        )
        self._rows_recorded += 1
        if self.on_record is not None:
            self.on_record(event, topic, status, payload)
        if self._linger is None and self._writer is not None:
            self._linger = asyncio.get_running_loop().call_later(LINGER, self._wakeup.set)

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

    # One hop per commit: commit() hands the batch to the database thread itself

    def _hand_over_soon(self) -> None:
        """Call :meth:`_hand_over` once the tasks ready in this loop iteration have run.

        So that their commits share the batch: handed over at once, the first commit of an
        iteration went alone, and with 64 senders (in-process) a batch held a third of the rows
        it held through the writer task (0.08 transactions a message against 0.03).
        """
        if not self._hand_over_due and self._inflight is None:
            self._hand_over_due = True
            asyncio.get_running_loop().call_soon(self._hand_over)

    def _hand_over(self) -> None:
        """Start a batch of the pending rows on the database thread, unless one is there already
        (its return starts the next), the writer task is at work (it writes them), or the log
        has stopped.

        This is the common path of every commit, with no task between the committers and the
        thread: the thread hands back a callback that releases the committers in the loop
        iteration that reads its wake-up. Through the writer task they ran one iteration later,
        after a step of the task, whose event and linger timer were armed again for every
        transaction.
        """
        self._hand_over_due = False
        if self._inflight is not None or self._draining or self._unavailable is not None:
            return
        writer, thread = self._writer, self._thread
        if writer is None or writer.done() or thread is None or not self._pending:
            return
        batch = self._pending[: self._rows_per_statement]
        self._chain_on_loop(batch)
        self._inflight = asyncio.get_running_loop().create_future()
        thread.submit(self._write_on_thread, (batch,), functools.partial(self._handed_back, batch))

    def _handed_back(self, batch: list[_Row], _: object, exc: BaseException | None) -> None:
        """The thread's answer for a batch :meth:`_hand_over` started (event loop)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None and not inflight.done():
            inflight.set_result(None)
        if exc is None:
            self._committed(len(batch))
            if self._waiters:
                self._hand_over_soon()  # the rows recorded meanwhile: group commit
            return
        self._prepared = None
        if not isinstance(exc, Exception):  # pragma: no cover - KeyboardInterrupt on the thread
            exc = AuditUnavailable(f"activity log write failed: {exc!r}")
        # The writer task retries the batch, splits it, or gives up, as for any batch.
        self._handed_failure = exc
        self._wakeup.set()

    # The writer task: rows nobody commits, failures, and the flush on close

    async def _run(self) -> None:
        """Drain the buffer whenever woken, until closed and drained (or failing)."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None
            try:
                await self._drain()
                if self._closing:
                    await self._drain()  # what was recorded while the last drain ran
            except AuditUnavailable as exc:
                self._fail_waiters(exc)
            if self._closing:
                return

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        """Fail the waiters however the writer ended: nobody may wait on it forever."""
        if not task.cancelled() and task.exception() is not None:
            logger.error("activity log writer crashed", exc_info=task.exception())
        self._fail_waiters(AuditUnavailable("activity log is closed"))

    async def _drain(self) -> None:
        """Write the rows pending now, one batch at a time, releasing waiters as rows commit;
        then leave the next batches to :meth:`_hand_over` again.

        Raises:
            AuditUnavailable: a batch failed every attempt (it is still pending), or the file
                was deleted or replaced (nothing more will be written).
        """
        self._draining = True
        try:
            while self._inflight is not None:  # the batch commit() handed over comes first
                await asyncio.wait({self._inflight})
            await self._write_pending(self._rows_recorded)
        finally:
            self._draining = False
        if self._waiters:
            self._hand_over()

    async def _write_pending(self, target: int) -> None:
        """Write pending rows until the first ``target`` ever recorded are committed. Stopping
        there, rather than at an empty buffer, gives a busy log back to :meth:`_hand_over`."""
        attempt, delay = 1, self.retry_delay
        failed, self._handed_failure = self._handed_failure, None
        if failed is not None and _retry_as_is(failed):  # as if the loop below had failed
            batch = self._pending[: self._rows_per_statement]
            delay = await self._failed(batch, failed, attempt, delay)
            attempt += 1
        while self._pending and self.rows_committed < target:
            if self._unavailable is not None:
                raise AuditUnavailable(self._unavailable)
            batch = self._pending[: self._rows_per_statement]
            try:
                await self._write_rows(batch)
            except Exception as exc:  # sqlite3.Error, OSError, ...: the database's trouble
                delay = await self._failed(batch, exc, attempt, delay)
                attempt += 1
            else:
                attempt, delay = 1, self.retry_delay

    async def _failed(self, batch: list[_Row], exc: Exception, attempt: int, delay: float) -> float:
        """Report a failed attempt at ``batch``, wait before the next; return the delay after.

        Raises:
            AuditUnavailable: that was the last attempt, or the file was deleted or replaced.
        """
        if isinstance(exc, _FileGone):
            self._unavailable = (
                f"activity log file was {exc}; nothing more can be logged: restart the bus"
            )
            logger.error("activity log file %s was %s; restart the bus", self.path, exc)
            raise AuditUnavailable(self._unavailable) from exc
        logger.warning(
            "activity log write of %d rows failed (attempt %d of %d): %r",
            len(batch),
            attempt,
            self.retries,
            exc,
        )
        if attempt >= self.retries:
            raise AuditUnavailable(
                f"activity log could not write {len(batch)} rows: {exc}"
            ) from exc
        await asyncio.sleep(delay)
        return delay * 2

    async def _write_rows(self, batch: list[_Row]) -> None:
        """Commit ``batch``, the head of the pending rows, releasing its waiters; if SQLite
        refuses it for what it holds, in halves, replacing each row it refuses alone.

        Raises:
            Exception: the error of the first part that could not be written, which is still
                pending with everything after it; the parts before it are committed.
        """
        try:
            await self._write_batch(batch)
        except Exception as exc:
            if _retry_as_is(exc):
                raise
            if len(batch) > 1:
                half = len(batch) // 2
                await self._write_rows(batch[:half])
                await self._write_rows(batch[half:])
                return
            if not _refused_for_content(batch[0], exc):
                raise
            await self._replace(batch[0], exc)
        self._committed(len(batch))

    async def _replace(self, row: _Row, exc: Exception) -> None:
        """Write a ``row_unwritable`` row instead of ``row``, which SQLite refused alone.

        Raises:
            Exception: no replacement could be written either, so the fault is the database's,
                not the row's: ``exc`` if even the smallest replacement was refused for what it
                holds, else the error that stopped it.
        """
        for replacement in _unwritable(row, exc):
            try:
                await self._write_batch([replacement])
            except Exception as error:
                if _retry_as_is(error):
                    raise
                continue
            self.rows_unwritable += 1
            logger.warning(
                "activity log stored a %r row as row_unwritable: %s", row[1], replacement[-1]
            )
            return
        raise exc

    def _committed(self, rows: int) -> None:
        del self._pending[:rows]
        self.rows_committed += rows
        self.batches_committed += 1
        while self._waiters and self._waiters[0][0] <= self.rows_committed:
            _, future = self._waiters.popleft()
            if not future.done():  # the caller may have been cancelled
                future.set_result(None)

    def _fail_waiters(self, exc: AuditUnavailable) -> None:
        # Rows are committed in order, so once a batch fails every remaining waiter needs it.
        while self._waiters:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_exception(exc)

    async def _write_batch(self, batch: list[_Row]) -> None:
        """Insert ``batch`` in one statement, one transaction, on the database thread.

        This is the one place the writer task writes rows after :meth:`open`; tests replace it
        (or :meth:`_insert`, which it runs on the thread) to simulate failures.

        Raises:
            _FileGone: the rows went to a file that is no longer at ``path``.
            Exception: what SQLite (or binding the rows) raised; nothing was written.
        """
        assert self._thread is not None
        self._chain_on_loop(batch)
        await self._thread.run(self._write_on_thread, batch)

    def _chain_on_loop(self, batch: list[_Row]) -> None:
        """Chain ``batch`` after the last row committed, for :meth:`_insert` to write.

        The chain is computed here, on the loop, while it holds the GIL anyway: on the database
        thread the same work made that thread wait for the GIL of a busy loop before and after
        it, and the bus lost a quarter of its throughput at window 64. Batches go one at a time,
        so self.head is the previous batch's.
        """
        assert self._chainer is not None
        last_id, last_chain = self.head or (0, None)
        try:
            self._prepared = (batch, *self._chainer.link(batch, last_id, last_chain))
        except Exception:  # a row SQLite will refuse too: _insert raises it in its place
            self._prepared = None

    # On the database thread

    def _connect(self, ts: str) -> None:
        # Autocommit: each batch is its own BEGIN IMMEDIATE ... COMMIT (see _insert).
        create_file(self.path)
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.executescript(
                # busy_timeout first: switching to WAL takes a lock another process may hold.
                f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)};"
                "PRAGMA journal_mode = WAL;"
                # Durable across a process crash; an OS crash may lose the last commits.
                "PRAGMA synchronous = NORMAL;"
            )
            opened = prepare(
                conn,
                self.path,
                schema=SCHEMA,
                columns=COLUMNS,
                key_path=self.key_file,
                accept_broken=self.accept_broken,
                ts=ts,
            )
            [(last_epoch,)] = conn.execute(
                "SELECT MAX(epoch) FROM activity_log WHERE event = 'send_start'"
            )
            if self.checkpoint_bytes is None:
                conn.execute("PRAGMA wal_autocheckpoint = 0")
            else:
                [(page_size,)] = conn.execute("PRAGMA page_size")
                pages = max(1, self.checkpoint_bytes // page_size)
                conn.execute(f"PRAGMA wal_autocheckpoint = {pages}")
                conn.execute(f"PRAGMA journal_size_limit = {self.checkpoint_bytes}")
            stat = os.stat(self.path)
        except BaseException:
            conn.close()
            raise
        self._conn, self._identity = conn, (stat.st_dev, stat.st_ino)
        self._chainer = Chainer(COLUMNS)
        self.head, self.started = opened.head, opened.started
        self.last_epoch = last_epoch or 0

    def _disconnect(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a failing disk: the head waits for next time
                self._heads.ship(self.head)
            self._conn.close()
            self._conn = None
        self._heads.close()

    def _write_on_thread(self, batch: list[_Row]) -> None:
        # Before the INSERT: the connection's -wal file keeps its name, so rows written after
        # the database file was replaced would land in the new file's WAL, over its pages.
        self._check_file()
        self._insert(batch)
        self._rows_since_checkpoint += len(batch)
        self._heads.rows += len(batch)

    def _insert(self, batch: list[_Row]) -> None:
        """Insert ``batch`` chained after the last row this log wrote (database thread; tests
        replace it to block).

        The chain comes from :meth:`_write_batch` (computed here if it is missing). If another
        process wrote a row since, the first id is taken and the ``activity_log_no_replace``
        trigger aborts the whole statement; then the batch is chained after the rows found, in
        a ``BEGIN IMMEDIATE`` transaction. One plain ``INSERT`` in the common case: each call
        into SQLite takes the GIL back from the busy event loop, and a transaction of four
        statements per batch cost the bus a third of its throughput at window 64; an ``INSERT
        ... SELECT`` guarded by the last id, 10% of its CPU.
        """
        conn, chainer = self._conn, self._chainer
        assert conn is not None and chainer is not None
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[0] is batch:
            _, params, head_id, head_chain = prepared
        else:
            last_id, last_chain = self.head or (0, None)
            params, head_id, head_chain = chainer.link(batch, last_id, last_chain)
        try:
            conn.execute(*_statement(params, len(batch)))
        except sqlite3.IntegrityError as exc:
            if _APPEND_ONLY not in str(exc):
                raise
            head_id, head_chain = self._insert_after_others(batch)
        self.head = (head_id, head_chain)

    def _insert_after_others(self, batch: list[_Row]) -> tuple[int, str]:
        conn, chainer = self._conn, self._chainer
        assert conn is not None and chainer is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            last_id, last_chain = conn.execute(_LAST_ROW).fetchone()
            if self.head is not None and last_id > self.head[0]:
                self._check_others(self.head)
            params, head_id, head_chain = chainer.link(batch, last_id, last_chain)
            conn.execute(*_statement(params, len(batch)))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return head_id, head_chain

    def _check_others(self, head: tuple[int, str]) -> None:
        """Verify the rows other connections wrote after ``head``; say so if one is forged.

        Cheap (only the rows since this log's last batch), and it makes a row forged with a
        plain ``INSERT`` while the bus runs visible at once on stderr, not only at the next
        ``bcpbus audit verify``.
        """
        assert self._conn is not None
        verifier = Verifier()
        verifier.resume(head)
        scan(self._conn, verifier, head[0] + 1)
        for problem in verifier.problems[:1]:
            logger.error(
                "activity log %s: row %s, written by another connection, does not verify: %s; "
                "run `bcpbus audit verify --db %s`",
                self.path,
                problem.row,
                problem.why,
                self.path,
            )

    def _after_batch(self) -> None:
        """Between batches, on the database thread: the checkpoint and the head, when due."""
        self._checkpoint_if_due()
        if self._heads.rows >= self._heads.every_rows:
            self._ship_head()

    def _ship_head(self) -> None:
        try:
            self._heads.ship(self.head)
        except OSError as exc:  # the next head will be tried; the log itself is fine
            logger.warning("could not write the activity log's head: %s", exc)

    def _ship_head_later(self) -> None:
        """The timer's turn (event loop): write the head on the thread if it moved."""
        if self._thread is not None and not self._closing:
            self._thread.run(self._ship_head)

    def _check_file(self) -> None:
        """Raise :class:`_FileGone` unless ``path`` is still the file the connection writes."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            raise _FileGone("deleted") from None
        except OSError as exc:  # cannot tell: fail closed rather than acknowledge blindly
            raise _FileGone(f"not checkable ({exc.strerror})") from exc
        if (stat.st_dev, stat.st_ino) != self._identity:
            raise _FileGone("replaced by another file")

    def _checkpoint_if_due(self) -> None:
        """Every ``checkpoint_rows`` rows, copy the WAL into the database and truncate it."""
        if self._rows_since_checkpoint < self.checkpoint_rows or self._conn is None:
            return
        self._rows_since_checkpoint = 0
        try:
            # busy_timeout 0: a checkpoint that would wait for a reader or another writer
            # copies what it can (like PASSIVE) and reports busy; the next one continues.
            self._conn.execute("PRAGMA busy_timeout = 0")
            try:
                [(busy, _, _)] = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
        # A checkpoint SQLite cannot finish reports busy; an error needs a failing disk.
        except Exception as exc:  # pragma: no cover - a failed one loses nothing: the WAL keeps
            logger.warning("activity log checkpoint failed: %r", exc)  # the rows
            busy = 1
        if not busy:
            self.checkpoints += 1


# Which failures are worth retrying the same batch for: the database's passing trouble. Any
# other failure may be the rows' fault, so the batch is split (ActivityLog._write_rows) until the
# row SQLite refuses is alone; see _refused_for_content for what happens to it then.
_RETRY_AS_IS = frozenset(
    {
        sqlite3.SQLITE_BUSY,  # another connection holds the lock past busy_timeout
        sqlite3.SQLITE_LOCKED,  # a conflict within this process's shared cache
        sqlite3.SQLITE_IOERR,  # the disk failed the read or write
        sqlite3.SQLITE_FULL,  # the disk or quota is full
        sqlite3.SQLITE_PROTOCOL,  # a WAL lock race between processes
        sqlite3.SQLITE_CANTOPEN,  # the -wal or -shm file cannot be opened (e.g. out of fds)
    }
)


def _retry_as_is(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a batch, is the database's passing trouble, not the rows'."""
    if isinstance(exc, _FileGone | MemoryError):  # sqlite3 raises SQLITE_NOMEM as MemoryError
        return True
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # absent when raised by Python code
    return code is None or code & 0xFF in _RETRY_AS_IS  # the primary result code


def _refused_for_content(row: _Row, exc: BaseException) -> bool:
    """Whether SQLite refused ``row``, written alone, for what it holds, so that a
    ``row_unwritable`` row may stand for it.

    It did if a column is not valid text (binding raises :exc:`UnicodeEncodeError`), or if the
    error is one a row can cause: a constraint or trigger (:exc:`sqlite3.IntegrityError`), a
    value too big (:exc:`sqlite3.DataError`), a value that cannot be bound. It did not for
    :exc:`sqlite3.OperationalError` (a read-only, locked or failing file) or a bare
    :exc:`sqlite3.DatabaseError` (a corrupt file): a good row must not be replaced because the
    database failed while it was alone; the batch fails and is retried instead.
    """
    if not all(_is_text(value) for value in row):
        return True
    return not isinstance(exc, sqlite3.OperationalError | sqlite3.InternalError) and (
        type(exc) is not sqlite3.DatabaseError
    )


def _unwritable(row: _Row, exc: BaseException) -> list[_Row]:
    """The ``row_unwritable`` rows that may stand for ``row``, best first: one that keeps the
    columns that are valid text, and one that keeps only the timestamp.

    A ``row_unwritable`` row stands for a row SQLite could not store (text that is not valid
    Unicode, such as a lone surrogate). It keeps the original's ``ts`` and those of
    ``message_id``, ``rpc_id``, ``actor``, ``topic`` and ``status`` that are valid text;
    ``error`` says why the row was refused; ``payload_json`` is ``{"event": ..., "columns":
    [...], "sha256": ...}``: the original event (non-text characters as ``\\uXXXX`` escapes),
    the columns that were not valid text, and the SHA-256 of ``json.dumps(list(row)).encode()``,
    the original row's columns in :data:`COLUMNS` order as a JSON array with Python's default
    separators and ASCII escapes.
    """
    bad = [name for name, value in zip(COLUMNS, row, strict=True) if not _is_text(value)]
    event = row[1]
    payload = _ENCODER.encode(
        {
            "event": None if event is None else _escape(event),
            "columns": bad,
            "sha256": hashlib.sha256(json.dumps(list(row)).encode()).hexdigest(),
        }
    )
    reason = _escape(f"{type(exc).__name__}: {exc}")[:500]
    kept = tuple(value if _is_text(value) else None for value in row[2:7])
    tail = tuple(value if _is_text(value) else None for value in row[9:])  # epoch, trace_id
    return [
        (row[0], "row_unwritable", *kept, payload, reason, *tail),
        (row[0], "row_unwritable", None, None, None, None, None, payload, reason, None, None),
    ]


def _is_text(value: str | None) -> bool:
    """Whether SQLite can store ``value``: NULL, or a str that is valid Unicode."""
    if value is None:
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _escape(text: str) -> str:
    """``text`` with what is not valid Unicode (lone surrogates) as ``\\uXXXX`` escapes."""
    return text.encode("utf-8", "backslashreplace").decode()


class _Clock:
    """Row timestamps: the wall clock, held while it is behind the last stamp given."""

    def __init__(self) -> None:
        self.last = 0  # microseconds since the epoch of the last stamp
        # The formatted date and time of the last second stamped: every row needs a timestamp,
        # and formatting only the microseconds is a third of the cost of datetime.isoformat().
        self.second: int | None = None
        self.prefix = ""

    def now(self) -> str:
        micros = time.time_ns() // 1000
        if micros < self.last:
            # The clock was stepped back: rows must stay in time order for audit --since.
            micros = self.last
        self.last = micros
        return self.format(micros)

    def format(self, micros: int) -> str:
        seconds, micros = divmod(micros, 1_000_000)
        if seconds != self.second:
            self.second = seconds
            self.prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(seconds))
        return f"{self.prefix}{micros:06d}Z"


_clock = _Clock()


def _now() -> str:
    """Now in UTC, ``2026-05-09T07:35:25.123456Z``: fixed width, so text order is time order;
    never earlier than the previous stamp, so row order is time order too."""
    return _clock.now()


# One encoder for every row: json.dumps() with options builds a new encoder on each call.
# allow_nan=False: NaN is not JSON, and SQLite's json functions reject the whole text.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _payload_json(payload: Any) -> str:
    try:
        return _ENCODER.encode(payload)
    except (TypeError, ValueError) as exc:
        # An audit row must not be lost for its payload's sake: keep a readable form of it.
        logger.warning("activity payload is not JSON (%s); stored as its repr", exc)
        return _ENCODER.encode(repr(payload))


_LAST_ROW = "SELECT id, chain FROM activity_log ORDER BY id DESC LIMIT 1"
_INSERTED = ("id", *COLUMNS, "chain")


def _statement(params: list[Any], rows: int) -> tuple[str, list[Any]]:
    """The ``INSERT`` and its parameters for ``rows`` rows of ``params``, padded with rows of
    NULLs, which it skips, to a size of :func:`_statement_rows`."""
    size = _statement_rows(rows)
    return _insert_sql(size), params + [None] * (len(_INSERTED) * (size - rows))


def _statement_rows(rows: int, *, up: bool = True) -> int:
    """``rows`` rounded up (or down) to a number with at most 3 significant bits: 1 to 8, 10,
    12, 14, 16, 20, ..., 768, 896.

    sqlite3 keeps the last 128 statements it ran prepared, and a multi-row ``INSERT`` costs
    about 1.6 KiB of SQLite memory per row: one statement per batch size filled that cache with
    whatever sizes the load produced, up to 200 MiB. Padded to these sizes, batches of up to
    896 rows use 35 statements (9 MiB in all), each under a quarter longer than needed.
    """
    shift = max(0, rows.bit_length() - _STATEMENT_BITS)
    fewer = rows >> shift << shift
    return fewer if fewer == rows or not up else fewer + (1 << shift)


_STATEMENT_BITS = 3
"""Significant bits of :func:`_statement_rows`' sizes: 4 sizes per doubling."""


@functools.lru_cache(maxsize=128)
def _insert_sql(rows: int) -> str:
    """A multi-row ``INSERT`` for up to ``rows`` rows: rows whose ``id`` is NULL are skipped."""
    values = "(" + ",".join("?" * len(_INSERTED)) + ")"
    return (
        f"INSERT INTO activity_log ({','.join(_INSERTED)}) SELECT * FROM (VALUES "
        + ",".join([values] * rows)
        + ") WHERE column1 IS NOT NULL"
    )


@functools.cache
def _max_rows_per_statement() -> int:
    """How many rows fit in one statement under SQLite's limit on bound parameters."""
    # The limit is compiled into the library (999 before SQLite 3.32, 32766 since).
    with contextlib.closing(sqlite3.connect(":memory:")) as probe:
        limit = probe.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return max(1, limit // len(_INSERTED))


def canonical_json(value: Any) -> bytes:
    """``value`` as canonical JSON: keys sorted, no spaces, UTF-8, non-ASCII kept as is.

    The form digests are computed over, so that anyone holding a message can recompute them.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_sha256(value: Any) -> str:
    """The hex SHA-256 of :func:`canonical_json` of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
