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
worth retrying as is (see :func:`retry_as_is`) is split in halves until the rows that cannot be
stored are alone; each is replaced by a ``row_unwritable`` row that keeps its timestamp, the
columns that are valid text, and the SHA-256 of the row (:func:`unwritable`), and the writer
moves on. A row is only replaced when SQLite refused it for what it holds
(:func:`refused_for_content`) and its replacement can be written, so a database that refuses
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
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from ..core.errors import AuditUnavailable
from ..core.logevents import LogEvent
from .chain import Heads, HeadSink
from .chain_v1 import default_key_path
from .dbthread import DatabaseThread
from .rows import LogRow, encode_payload, refused_for_content, stamp, unwritable
from .schema import max_rows_per_statement, statement_rows
from .store import FileGone, LogStore, retry_as_is

__all__ = [
    "CHECKPOINT_BYTES",
    "CHECKPOINT_ROWS",
    "HEAD_EVERY_ROWS",
    "HEAD_EVERY_SECONDS",
    "LINGER",
    "ActivityLog",
]

logger = logging.getLogger("bus.log.activity")

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
        self.batches_committed = 0
        """Transactions committed so far; fewer than :meth:`commit` calls when they were grouped."""
        self.rows_committed = 0
        """Rows committed so far by this instance, ``row_unwritable`` replacements included."""
        self.rows_unwritable = 0
        """Rows replaced by a ``row_unwritable`` row so far."""
        self.on_record: Callable[[str, str | None, str | None, Any], None] | None = None
        """Told ``(event, topic, status, payload)`` of every row recorded, as it is recorded
        (:mod:`bus.ops.metrics` counts messages, errors and bits charged this way)."""
        self.on_commit: Callable[[float], None] | None = None
        """Told how many seconds each :meth:`commit` that had to wait waited."""
        self._store = LogStore(
            self.path,
            key_file=Path(key_file) if key_file is not None else default_key_path(self.path),
            accept_broken=accept_broken,
            checkpoint_rows=checkpoint_rows,
            checkpoint_bytes=checkpoint_bytes,
            heads=Heads(head, head_every_rows, head_every_seconds, checkpoints),
        )
        self._thread: DatabaseThread | None = None  # where every statement runs
        self._start_writer_state()

    def _start_writer_state(self) -> None:
        """The rows waiting for the disk, their committers, and what moves them there."""
        # Rows recorded and not yet committed, oldest first. A batch is a prefix of it and leaves
        # only once committed, so a failed batch is retried with the next one, in order.
        self._pending: list[LogRow] = []
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
        self._rows_per_statement = self.batch_max
        self._closing = False
        self._closed = asyncio.Event()
        # Why the log stopped for good (its file deleted or replaced); None while it works.
        self._unavailable: str | None = None

    # What the file holds

    @property
    def head(self) -> tuple[int, str] | None:
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
            LogRow(
                stamp(),
                # The member's plain str: SQLite binds it without adapting a subclass, and the
                # chain's encoding keeps to its all-text path.
                event._value_,
                message_id,
                None if rpc_id is None else str(rpc_id),
                actor,
                topic,
                status,
                payload_json if payload is None else encode_payload(payload),
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
        self._store.prepare(batch)
        self._inflight = asyncio.get_running_loop().create_future()
        thread.submit(self._store.write, (batch,), functools.partial(self._handed_back, batch))

    def _handed_back(self, batch: list[LogRow], _: object, exc: BaseException | None) -> None:
        """The thread's answer for a batch :meth:`_hand_over` started (event loop)."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None and not inflight.done():
            inflight.set_result(None)
        if exc is None:
            self._committed(len(batch))
            if self._waiters:
                self._hand_over_soon()  # the rows recorded meanwhile: group commit
            return
        self._store.forget()
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
        if failed is not None and retry_as_is(failed):  # as if the loop below had failed
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

    async def _failed(
        self, batch: list[LogRow], exc: Exception, attempt: int, delay: float
    ) -> float:
        """Report a failed attempt at ``batch``, wait before the next; return the delay after.

        Raises:
            AuditUnavailable: that was the last attempt, or the file was deleted or replaced.
        """
        if isinstance(exc, FileGone):
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

    async def _write_rows(self, batch: list[LogRow]) -> None:
        """Commit ``batch``, the head of the pending rows, releasing its waiters; if SQLite
        refuses it for what it holds, in halves, replacing each row it refuses alone.

        Raises:
            Exception: the error of the first part that could not be written, which is still
                pending with everything after it; the parts before it are committed.
        """
        try:
            await self._write_batch(batch)
        except Exception as exc:
            if retry_as_is(exc):
                raise
            if len(batch) > 1:
                half = len(batch) // 2
                await self._write_rows(batch[:half])
                await self._write_rows(batch[half:])
                return
            if not refused_for_content(batch[0], exc):
                raise
            await self._replace(batch[0], exc)
        self._committed(len(batch))

    async def _replace(self, row: LogRow, exc: Exception) -> None:
        """Write a ``row_unwritable`` row instead of ``row``, which SQLite refused alone.

        Raises:
            Exception: no replacement could be written either, so the fault is the database's,
                not the row's: ``exc`` if even the smallest replacement was refused for what it
                holds, else the error that stopped it.
        """
        for replacement in unwritable(row, exc):
            try:
                await self._write_batch([replacement])
            except Exception as error:
                if retry_as_is(error):
                    raise
                continue
            self.rows_unwritable += 1
            logger.warning(
                "activity log stored a %r row as row_unwritable: %s", row.event, replacement.error
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

    async def _write_batch(self, batch: list[LogRow]) -> None:
        """Insert ``batch`` in one statement, one transaction, on the database thread.

        This is the one place the writer task writes rows after :meth:`open`; tests replace it
        (or :meth:`_insert`, which it runs on the thread) to simulate failures.

        Raises:
            FileGone: the rows went to a file that is no longer at ``path``.
            Exception: what SQLite (or binding the rows) raised; nothing was written.
        """
        assert self._thread is not None
        self._store.prepare(batch)
        await self._thread.run(self._store.write, batch)

    def _ship_head_later(self) -> None:
        """The timer's turn (event loop): write the head on the thread if it moved."""
        if self._thread is not None and not self._closing:
            self._thread.run(self._store.ship_head)
