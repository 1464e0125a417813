"""The append-only SQLite activity log: every protocol event, written in batches by one task.

Callers :meth:`ActivityLog.record` rows (synchronous, a tuple append) and
:meth:`~ActivityLog.commit` when they need them on disk before going on; the bus commits before
it answers each ``sendMessage``, so a message is never delivered without its audit row (fail
closed). One writer task drains the buffer: each batch is one ``INSERT`` statement, which SQLite
runs as one transaction, however many callers wait on it (group commit).

The writer runs the ``INSERT`` on the event loop's own thread, on a connection that never waits
for a lock: a small transaction costs tens of microseconds there, less than a hop to another
thread and back. When another process holds the write lock, the batch goes to the database
thread (:mod:`aiosqlite`), which may wait for it. WAL checkpoints, which copy the log into the
database file and ``fsync``, also run on that thread, so the loop never stalls on the disk.

The database itself refuses to change history, for every connection: triggers abort ``UPDATE``,
``DELETE``, and an ``INSERT`` that reuses an existing id (which is how ``INSERT OR REPLACE`` would
overwrite a row). Anyone who can write the file can still drop the triggers; protect the file with
filesystem permissions.

Timestamps are stamped when a row is recorded and never go backwards in row order (a clock
stepped back holds the last value until it catches up), so ``audit --since/--until`` find every
row.

Several processes may write one file (WAL mode, ``busy_timeout``). Read it with plain SQL or with
:mod:`bus.audit`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import json
import logging
import os
import sqlite3
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import aiosqlite

from .errors import AuditUnavailable

__all__ = ["COLUMNS", "EVENTS", "LINGER", "SCHEMA", "ActivityLog"]

logger = logging.getLogger("bus.activity")

EVENTS: frozenset[str] = frozenset(
    {
        # The bus, per message: sendMessage received, delivery to one target started and
        # finished (status = outcome), sendMessage answered.
        "send_start",
        "process_start",
        "process_finish",
        "send_finish",
        # The bus, per connection.
        "connect",  # WebSocket accepted; actor = remote address
        "disconnect",  # connection closed; status = close code
        "initialize",  # a peer authenticated as actor
        "auth_failed",  # initialize with an unknown clientId or a wrong token
        "replaced",  # a newer connection took over the clientId; the old one was closed
        "initialize_timeout",  # no initialize within the configured time
        "frame_too_large",  # a frame above the configured maximum size
        # The bus, per request.
        "refused",  # authorization/policy refusal; status = reason
        "taint_refused",  # delivery from a tainted peer to an untainted one refused
        "limit_exceeded",  # a configured limit was hit; status = which limit
        "rpc_error",  # a request answered with a JSON-RPC error
        "subscribe",  # topic = the pattern
        "unsubscribe",  # topic = the pattern
        "shutdown",  # the bus is closing
        # The gateway (actor "system:gateway"). The payload carries query_id or subscription_id
        # and channel ("bcp:<controller>:<reader>").
        "bcp_query_accepted",
        "bcp_query_refused",  # status = reason code
        "bcp_bits_charged",  # payload: bits, budget_bits, budget_left
        "bcp_validation",  # status = pass | fail; payload: reasons
        "bcp_delivered",  # the normalized answer reached the controller
        "bcp_query_failed",  # status = reason (budget_exhausted, timeout, ...)
        "bcp_approval_requested",
        "bcp_approval_decided",  # status = approve | reject | edit
        "bcp_expired",  # a pending query timed out
        "bcp_push_received",  # a subscription push from a reader
        "bcp_push_refused",  # status = reason code
    }
)
"""The event names bcpbus writes. :meth:`ActivityLog.record` accepts any string, so a new event
needs no schema change; add it here so auditors know it exists."""

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
)
"""The columns :meth:`ActivityLog.record` fills, in the order of each buffered row (``id`` is
assigned by SQLite)."""

_APPEND_ONLY = "activity_log is append-only"


LINGER = 0.05
"""Seconds a recorded row may wait for a transaction when no caller commits it."""

CHECKPOINT_ROWS = 20_000
"""Rows committed between two WAL checkpoints (run off the event loop); SQLite's own automatic
checkpoint, which would run inside a commit on the loop, is turned off for the writer."""

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
    error TEXT
);
CREATE INDEX IF NOT EXISTS idx_activity_message_id ON activity_log(message_id);
CREATE INDEX IF NOT EXISTS idx_activity_ts ON activity_log(ts);
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
"""The DDL :meth:`ActivityLog.open` runs; idempotent, so every process may run it."""

_Row = tuple[str | None, ...]


class ActivityLog:
    """The activity log writer: buffer rows, write them in batches, report commits.

    Use it as ``async with ActivityLog(path) as log:`` or call :meth:`open` and :meth:`close`.

    Args:
        path: the SQLite file; created with its schema if missing.
        batch_max: most rows written in one transaction; more pending rows take several. Also
            capped by SQLite's bound-parameter limit (3640 rows on SQLite 3.32 or later).
        retries: how many times a batch is attempted before its waiters get
            :class:`~bus.errors.AuditUnavailable`.
        retry_delay: seconds before the second attempt, doubling for each further one.
        queue_max: most rows held in memory waiting for the disk; past it :meth:`record` raises
            :class:`~bus.errors.AuditUnavailable` rather than drop anything.
        checkpoint_rows: rows committed between two WAL checkpoints, which run on the database
            thread; fewer keep the ``-wal`` file smaller, more cost less.
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
    ) -> None:
        self.path = Path(path)
        """The SQLite file."""
        self.batch_max = batch_max
        self.retries = max(1, retries)
        self.retry_delay = retry_delay
        self.queue_max = queue_max
        self.checkpoint_rows = checkpoint_rows
        self.checkpoints = 0
        """WAL checkpoints completed so far by this instance."""
        self.batches_committed = 0
        """Transactions committed so far; fewer than :meth:`commit` calls when they were grouped."""
        self.rows_committed = 0
        """Rows committed so far by this instance."""

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
        # The thread connection: schema, writes that must wait for a lock, checkpoints.
        self._db: aiosqlite.Connection | None = None
        # The loop's connection: every batch is tried here first (busy_timeout 0).
        self._inline: sqlite3.Connection | None = None
        self._rows_since_checkpoint = 0
        self._checkpoint: asyncio.Task[None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._rows_per_statement = batch_max
        self._closing = False
        self._closed = asyncio.Event()

    # Lifecycle

    async def open(self) -> None:
        """Open (or create) the database and start the writer task.

        Raises:
            sqlite3.Error: the file cannot be opened or is not a database; fix the path or its
                permissions, since nothing can be logged (and so nothing delivered) without it.
            RuntimeError: the log was already opened.
        """
        if self._db is not None or self._closing:
            raise RuntimeError("the activity log was already opened")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit: each batch is a single INSERT statement, which SQLite makes atomic on its
        # own, so a batch needs no separate COMMIT (and no second hop to the db thread).
        db = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            await db.executescript(
                # busy_timeout first: switching to WAL takes a lock another process may hold.
                "PRAGMA busy_timeout = 5000;"
                "PRAGMA journal_mode = WAL;"
                # Durable across a process crash; an OS crash may lose the last commits.
                "PRAGMA synchronous = NORMAL;" + SCHEMA
            )
            inline = _open_inline(self.path)
        except BaseException:
            await db.close()
            raise
        self._db, self._inline = db, inline
        self._rows_per_statement = min(self.batch_max, _max_rows_per_statement())
        self._writer = asyncio.create_task(self._run(), name=f"activity-writer {self.path}")
        self._writer.add_done_callback(self._writer_done)
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
            if self._checkpoint is not None:
                await asyncio.wait({self._checkpoint})
            if self._inline is not None:
                self._inline.close()
            if self._db is not None:
                await self._db.close()
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

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called; a closed log takes no more rows."""
        return self._closing

    # Writing

    def record(
        self,
        event: str,
        *,
        message_id: str | None = None,
        rpc_id: str | int | None = None,
        actor: str | None = None,
        topic: str | None = None,
        status: str | None = None,
        payload: Any = None,
        error: str | None = None,
        payload_json: str | None = None,
    ) -> None:
        """Buffer one row, stamped now, for the writer. Never waits.

        The row is on disk only once a later :meth:`commit` returns; await that before acting on
        anything that must be audited first.

        Args:
            event: what happened; see :data:`EVENTS`.
            payload: anything JSON can represent; stored as ``payload_json``. A value it can't
                (NaN, a cycle) is stored as the JSON string of its ``repr`` rather than lost.
            rpc_id: the JSON-RPC id; stored as text.
            payload_json: the payload already encoded as JSON, instead of ``payload``, for a
                caller that stores the same payload many times.

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
                event,
                message_id,
                None if rpc_id is None else str(rpc_id),
                actor,
                topic,
                status,
                payload_json if payload is None else _payload_json(payload),
                error,
            )
        )
        self._rows_recorded += 1
        if self._linger is None and self._writer is not None:
            self._linger = asyncio.get_running_loop().call_later(LINGER, self._wakeup.set)

    async def commit(self) -> None:
        """Return once every row recorded before this call is committed.

        Concurrent callers share one transaction. The wait is bounded: at most ``retries``
        attempts, each bounded by SQLite's 5 s busy timeout.

        Raises:
            AuditUnavailable: the rows could not be written after ``retries`` attempts, or the
                log closed first. Do not carry out what they record; the rows stay buffered and
                are retried with the next batch.
            RuntimeError: the log was never opened.
        """
        target = self._rows_recorded
        if self.rows_committed >= target:
            return
        if self._writer is None:
            raise RuntimeError("call ActivityLog.open() before commit()")
        if self._writer.done():
            raise AuditUnavailable("activity log is closed")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, future))
        self._wakeup.set()
        await future

    async def write(self, event: str, **fields: Any) -> None:
        """:meth:`record` one row and :meth:`commit` it; the arguments are :meth:`record`'s.

        Raises:
            AuditUnavailable: as for :meth:`record` and :meth:`commit`.
        """
        self.record(event, **fields)
        await self.commit()

    # The writer task

    async def _run(self) -> None:
        """Drain the buffer whenever rows arrive, until closed and drained (or failing)."""
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None
            try:
                await self._drain()
            except AuditUnavailable as exc:
                self._fail_waiters(exc)
                if self._closing:
                    return
            else:
                if self._closing:
                    return

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        """Fail the waiters however the writer ended: nobody may wait on it forever."""
        if not task.cancelled() and task.exception() is not None:
            logger.error("activity log writer crashed", exc_info=task.exception())
        self._fail_waiters(AuditUnavailable("activity log is closed"))

    async def _drain(self) -> None:
        """Write every pending row, one batch at a time, releasing waiters as batches commit.

        Raises:
            AuditUnavailable: a batch failed every attempt; it is still pending.
        """
        while self._pending:
            batch = self._pending[: self._rows_per_statement]
            await self._write_with_retries(batch)
            del self._pending[: len(batch)]
            self.rows_committed += len(batch)
            self.batches_committed += 1
            self._release_waiters()
            self._rows_since_checkpoint += len(batch)
        self._maybe_checkpoint()

    async def _write_with_retries(self, batch: list[_Row]) -> None:
        delay = self.retry_delay
        attempt = 1
        while True:
            try:
                await self._write_batch(batch)
                return
            except Exception as exc:  # sqlite3.Error, or ValueError from a closed connection
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
            delay *= 2
            attempt += 1

    async def _write_batch(self, batch: list[_Row]) -> None:
        """Insert ``batch`` in one statement, one transaction: on the loop's connection, or on
        the database thread when another process holds the write lock.

        This is the one place that writes rows after :meth:`open`; tests replace it to simulate
        failures.
        """
        assert self._inline is not None and self._db is not None
        sql, params = _insert_sql(len(batch)), list(itertools.chain.from_iterable(batch))
        try:
            self._inline.execute(sql, params)
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:  # the primary code
                raise
        # Another writer holds the lock: wait for it (busy_timeout) off the loop.
        await self._db.execute(sql, params)

    def _maybe_checkpoint(self) -> None:
        """Start a passive WAL checkpoint on the database thread every ``checkpoint_rows``."""
        if self._rows_since_checkpoint < self.checkpoint_rows or self._checkpoint is not None:
            return
        self._rows_since_checkpoint = 0
        self._checkpoint = asyncio.get_running_loop().create_task(self._run_checkpoint())

    async def _run_checkpoint(self) -> None:
        assert self._db is not None
        try:
            # PASSIVE: copies what it can without blocking the writer; the next one continues.
            await self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            self.checkpoints += 1
        except Exception as exc:  # a failed checkpoint loses nothing; the WAL keeps the rows
            logger.warning("activity log checkpoint failed: %r", exc)
        finally:
            self._checkpoint = None

    def _release_waiters(self) -> None:
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


def _open_inline(path: Path) -> sqlite3.Connection:
    """The writer's connection on the loop's thread: it never waits for another process's lock
    (that batch goes to the database thread instead) and never checkpoints inside a commit (see
    :meth:`ActivityLog._maybe_checkpoint`)."""
    inline = sqlite3.connect(path, isolation_level=None)
    try:
        inline.executescript(
            "PRAGMA busy_timeout = 0; PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0;"
        )
    except BaseException:
        inline.close()
        raise
    return inline


@functools.lru_cache(maxsize=128)
def _insert_sql(rows: int) -> str:
    """A multi-row ``INSERT`` for ``rows`` rows (cached: batch sizes repeat under steady load)."""
    values = "(" + ",".join("?" * len(COLUMNS)) + ")"
    return f"INSERT INTO activity_log ({','.join(COLUMNS)}) VALUES " + ",".join([values] * rows)


@functools.cache
def _max_rows_per_statement() -> int:
    """How many rows fit in one statement under SQLite's limit on bound parameters."""
    # The limit is compiled into the library (999 before SQLite 3.32, 32766 since).
    with contextlib.closing(sqlite3.connect(":memory:")) as probe:
        limit = probe.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return max(1, limit // len(COLUMNS))
