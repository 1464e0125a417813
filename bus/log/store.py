"""The activity log's file, as the database thread sees it: open it, insert chained batches,
checkpoint the WAL, write the head.

:class:`LogStore` holds the connection and what only the database thread touches, apart from
:meth:`LogStore.prepare`, which chains a batch on the event loop (see there why). The writer
(:class:`bus.log.activity.ActivityLog`) decides what to write and when; this module only writes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from pathlib import Path
from typing import Any

from .chain import Chainer, Head, Verifier
from .heads import Heads
from .logfile import create_file, prepare, scan
from .rows import COLUMNS, LogRow
from .schema import APPEND_ONLY, BUSY_TIMEOUT, LAST_ROW, SCHEMA, statement

__all__ = ["FileGone", "LogStore", "retry_as_is"]

logger = logging.getLogger("bus.log.activity")


class FileGone(Exception):
    """The file at the log's path is not the one its connection writes (database thread)."""


class LogStore:
    """The log's SQLite file and its chain, written from the database thread.

    Args:
        path: the SQLite file; created with its schema if missing.
        key_file: the key of a log an earlier version chained (read only to check it).
        accept_broken: open a log whose chain or triggers show a change anyway.
        checkpoint_rows: rows committed between two ``TRUNCATE`` checkpoints.
        checkpoint_bytes: WAL size of SQLite's own checkpoints; ``None`` for none.
        heads: where the head goes as it moves.
    """

    def __init__(
        self,
        path: Path,
        *,
        key_file: Path,
        accept_broken: bool,
        checkpoint_rows: int,
        checkpoint_bytes: int | None,
        heads: Heads,
    ) -> None:
        self.path = path
        self.key_file = key_file
        self.accept_broken = accept_broken
        self.checkpoint_rows = checkpoint_rows
        self.checkpoint_bytes = checkpoint_bytes
        self.heads = heads
        self.checkpoints = 0
        """WAL checkpoints that completed (the WAL truncated) so far."""
        self.head: Head | None = None
        """The id and ``chain`` of the last row written (or found on opening)."""
        self.started: str | None = None
        """The ``status`` of the ``chain_start`` row opening wrote, or None if it wrote none."""
        self.last_epoch = 0
        """The highest message epoch in the file when it was opened (0 for none)."""
        self.conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the file opened
        self._rows_since_checkpoint = 0
        self._refused_after = 0  # the last row id of others' rows that did not verify
        self._chainer = Chainer(COLUMNS)
        # The INSERT parameters and head of the batch about to be written, chained on the loop.
        self._prepared: tuple[list[LogRow], list[Any], int, str] | None = None

    # On the event loop

    def prepare(self, batch: list[LogRow]) -> None:
        """Chain ``batch`` after the last row committed, for :meth:`insert` to write.

        The chain is computed here, on the loop, while it holds the GIL anyway: on the database
        thread the same work made that thread wait for the GIL of a busy loop before and after
        it, and the bus lost a quarter of its throughput at window 64. Batches go one at a time,
        so self.head is the previous batch's.
        """
        last_id, last_chain = self.head or (0, None)
        try:
            self._prepared = (batch, *self._chainer.link(batch, last_id, last_chain))
        except Exception:  # a row SQLite will refuse too: insert() raises it in its place
            self._prepared = None

    def forget(self) -> None:
        """Drop the batch :meth:`prepare` chained: it failed, and may be written otherwise."""
        self._prepared = None

    # On the database thread

    def connect(self, ts: str) -> None:
        """Open the file (created 0600 if missing), migrate and check it; ``ts`` stamps the
        ``chain_start`` row it may write.

        Raises:
            sqlite3.Error, ChainBroken, ValueError: as :meth:`ActivityLog.open` says.
        """
        # Autocommit: each batch is its own statement, or BEGIN IMMEDIATE ... COMMIT.
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
            self._set_checkpoints(conn)
            stat = os.stat(self.path)
        except BaseException:
            conn.close()
            raise
        self.conn, self._identity = conn, (stat.st_dev, stat.st_ino)
        self.head, self.started = opened.head, opened.started
        self.last_epoch = last_epoch or 0

    def _set_checkpoints(self, conn: sqlite3.Connection) -> None:
        if self.checkpoint_bytes is None:
            conn.execute("PRAGMA wal_autocheckpoint = 0")
            return
        [(page_size,)] = conn.execute("PRAGMA page_size")
        pages = max(1, self.checkpoint_bytes // page_size)
        conn.execute(f"PRAGMA wal_autocheckpoint = {pages}")
        conn.execute(f"PRAGMA journal_size_limit = {self.checkpoint_bytes}")

    def disconnect(self) -> None:
        """Write the last head and close the file."""
        if self.conn is not None:
            with contextlib.suppress(Exception):  # a failing disk: the head waits for next time
                self.heads.ship(self.head)
            self.conn.close()
            self.conn = None
        self.heads.close()

    def write(self, batch: list[LogRow]) -> None:
        """Insert ``batch`` in one transaction, if the file is still the one opened.

        Raises:
            FileGone: the file at ``path`` was deleted or replaced; nothing was written.
            Exception: what SQLite (or binding the rows) raised; nothing was written.
        """
        # Before the INSERT: the connection's -wal file keeps its name, so rows written after
        # the database file was replaced would land in the new file's WAL, over its pages.
        self._check_file()
        self.insert(batch)
        self._rows_since_checkpoint += len(batch)
        self.heads.rows += len(batch)

    def insert(self, batch: list[LogRow]) -> None:
        """Insert ``batch`` chained after the last row this log wrote (tests replace it to
        block).

        The chain comes from :meth:`prepare` (computed here if it is missing). If another
        process wrote a row since, the first id is taken and the ``activity_log_no_replace``
        trigger aborts the whole statement; then the batch is chained after the rows found, in
        a ``BEGIN IMMEDIATE`` transaction. One plain ``INSERT`` in the common case: each call
        into SQLite takes the GIL back from the busy event loop, and a transaction of four
        statements per batch cost the bus a third of its throughput at window 64; an ``INSERT
        ... SELECT`` guarded by the last id, 10% of its CPU.
        """
        conn = self.conn
        assert conn is not None
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared[0] is batch:
            _, params, head_id, head_chain = prepared
        else:
            last_id, last_chain = self.head or (0, None)
            params, head_id, head_chain = self._chainer.link(batch, last_id, last_chain)
        try:
            conn.execute(*statement(params, len(batch)))
        except sqlite3.IntegrityError as exc:
            if APPEND_ONLY not in str(exc):
                raise
            head_id, head_chain = self._insert_after_others(batch)
        self.head = Head(head_id, head_chain)

    def _insert_after_others(self, batch: list[LogRow]) -> tuple[int, str]:
        conn = self.conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            last_id, last_chain = conn.execute(LAST_ROW).fetchone()
            if self.head is not None and last_id > self.head.id:
                self._check_others(self.head)
            params, head_id, head_chain = self._chainer.link(batch, last_id, last_chain)
            conn.execute(*statement(params, len(batch)))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return head_id, head_chain

    def _check_others(self, head: Head) -> bool:
        """Verify the rows other connections wrote after ``head``; say so if one is forged.

        Cheap (only the rows since this log's last batch), and it makes a row forged with a
        plain ``INSERT`` while the bus runs visible at once on stderr, not only at the next
        ``bcpbus audit verify``. Return whether they all verify.
        """
        assert self.conn is not None
        verifier = Verifier()
        verifier.resume(head)
        scan(self.conn, verifier, head.id + 1)
        for problem in verifier.problems[:1]:
            logger.error(
                "activity log %s: row %s, written by another connection, does not verify: %s; "
                "run `bcpbus audit verify --db %s`",
                self.path,
                problem.row,
                problem.why,
                self.path,
            )
        return not verifier.problems

    def after_batch(self) -> None:
        """Between batches: the checkpoint and the head, when due."""
        self._checkpoint_if_due()
        if self.heads.rows >= self.heads.every_rows:
            self.ship_head()

    def ship_head(self) -> None:
        """Write the head where it goes, if it moved, over the rows others wrote since too;
        a failure waits for the next one."""
        try:
            self._take_others()
        except sqlite3.Error as exc:  # a busy or failing file: this log's own head still goes
            logger.warning("could not read the activity log's last row: %s", exc)
        try:
            self.heads.ship(self.head)
        except OSError as exc:  # the next head will be tried; the log itself is fine
            logger.warning("could not write the activity log's head: %s", exc)

    def _take_others(self) -> None:
        """Move the head over rows other connections wrote after it, once they verify.

        ``bcpbus gateway`` and ``bcpbus budget reset`` write to this file with no signing key:
        their rows are signed by the bus's checkpoints. Without this, an idle bus would sign
        only its own last row, again and again, and leave theirs unsigned until it writes one.
        """
        if self.conn is None or self.head is None:
            return
        found = self.conn.execute(LAST_ROW).fetchone()
        if found is None or found[0] <= self.head.id or found[0] == self._refused_after:
            return
        if self._check_others(self.head):
            self.head = Head(*found)
        else:  # never signed; checked again, and said again, only once more rows come
            self._refused_after = found[0]

    def _check_file(self) -> None:
        """Raise :class:`FileGone` unless ``path`` is still the file the connection writes."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            raise FileGone("deleted") from None
        except OSError as exc:  # cannot tell: fail closed rather than acknowledge blindly
            raise FileGone(f"not checkable ({exc.strerror})") from exc
        if (stat.st_dev, stat.st_ino) != self._identity:
            raise FileGone("replaced by another file")

    def _checkpoint_if_due(self) -> None:
        """Every ``checkpoint_rows`` rows, copy the WAL into the database and truncate it."""
        if self._rows_since_checkpoint < self.checkpoint_rows or self.conn is None:
            return
        self._rows_since_checkpoint = 0
        try:
            # busy_timeout 0: a checkpoint that would wait for a reader or another writer
            # copies what it can (like PASSIVE) and reports busy; the next one continues.
            self.conn.execute("PRAGMA busy_timeout = 0")
            try:
                [(busy, _, _)] = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
        # A checkpoint SQLite cannot finish reports busy; an error needs a failing disk.
        except Exception as exc:  # pragma: no cover - a failed one loses nothing: the WAL keeps
            logger.warning("activity log checkpoint failed: %r", exc)  # the rows
            busy = 1
        if not busy:
            self.checkpoints += 1


# Which failures are worth retrying the same batch for: the database's passing trouble. Any
# other failure may be the rows' fault, so the batch is split (ActivityLog._write_rows) until the
# row SQLite refuses is alone; see bus.log.rows.refused_for_content for what happens to it then.
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


def retry_as_is(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a batch, is the database's passing trouble, not the rows'."""
    if isinstance(exc, FileGone | MemoryError):  # sqlite3 raises SQLITE_NOMEM as MemoryError
        return True
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)  # absent when raised by Python code
    return code is None or code & 0xFF in _RETRY_AS_IS  # the primary result code
