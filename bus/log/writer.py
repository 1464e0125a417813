"""Moving recorded rows to the database: the hand-over to the thread, the writer task.

:class:`Writer` is the part of :class:`bus.log.activity.ActivityLog` that decides what goes to
the database thread and when: it hands each batch to the thread, and retries, splits or
replaces what fails. The rows recorded and not yet committed and the ``commit()`` callers
waiting for them are :class:`~bus.log.batches.Batches`', which it inherits.
:class:`~bus.log.store.LogStore` writes; :class:`ActivityLog` records and answers commits.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from ..core.errors import AuditUnavailable
from .batches import Batches
from .dbthread import DatabaseThread
from .rows import LogRow, refused_for_content, unwritable
from .store import FileGone, LogStore, retry_as_is

__all__ = ["Writer"]

logger = logging.getLogger("bus.log.activity")


LINGER = 0.05
"""Seconds a recorded row may wait for a transaction when no caller commits it."""


class Writer(Batches):
    """What moves the rows waiting for the disk there (:class:`~bus.log.batches.Batches` keeps
    them and their committers): the hand-over to the database thread, the linger timer, and the
    writer task that retries, splits or replaces what fails.

    The base of :class:`~bus.log.activity.ActivityLog`, which fills :attr:`_pending` and
    :attr:`_waiters`; use that class.

    Args:
        store: the file, written on the database thread.
        batch_max: most rows written in one transaction (see ``ActivityLog``).
        retries: how many times a batch is attempted before its waiters get
            :class:`~bus.core.errors.AuditUnavailable`.
        retry_delay: seconds before the second attempt, doubling for each further one.
    """

    def __init__(
        self, store: LogStore, *, batch_max: int, retries: int, retry_delay: float
    ) -> None:
        super().__init__(batch_max)
        self.retries = max(1, retries)
        self.retry_delay = retry_delay
        self.rows_unwritable = 0
        """Rows replaced by a ``row_unwritable`` row so far."""
        self._store = store
        self._thread: DatabaseThread | None = None  # where every statement runs
        self._wakeup = asyncio.Event()  # the writer task's: a failure to handle, or close()
        # Hands over the rows nobody commits (connection events), LINGER seconds after the first
        # of them. Handing over on every record() would start a transaction for the first row
        # of each message and another for the rest.
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
        self._closing = False
        self._closed = asyncio.Event()
        # Why the log stopped for good (its file deleted or replaced); None while it works.
        self._unavailable: str | None = None

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
        batch = self._next_batch()
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
            elif self._pending:
                self._linger_soon()  # rows nobody commits, recorded while it was away
            return
        self._store.forget()
        if not isinstance(exc, Exception):  # pragma: no cover - KeyboardInterrupt on the thread
            exc = AuditUnavailable(f"activity log write failed: {exc!r}")
        # The writer task retries the batch, splits it, or gives up, as for any batch.
        self._handed_failure = exc
        self._wakeup.set()

    # Rows nobody commits (connection events): written LINGER seconds after the first

    def _linger_soon(self) -> None:
        """Have the pending rows written within :data:`LINGER` seconds, committed or not."""
        if self._linger is None and self._writer is not None:
            self._linger = asyncio.get_running_loop().call_later(LINGER, self._lingered)

    def _lingered(self) -> None:
        """:data:`LINGER` seconds after a row was recorded: hand the pending rows over.

        On the one-hop path, as a commit would: a batch on the thread (or about to go) takes
        what was recorded before it, and the timer is armed again for what may be left. Under
        load a commit always has a batch there, so this costs a timer every ``LINGER``
        seconds; when the writer task wrote these rows, it took over from the committers that
        often, for a batch through a future and a task step.
        """
        self._linger = None
        if self._closing or self._draining or self._handed_failure is not None:
            self._wakeup.set()  # the writer task is at work, or has work: it writes them
        elif self._inflight is not None or self._hand_over_due:
            self._linger_soon()
        else:
            self._hand_over()

    # The writer task: failures, and the flush on close

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
            batch = self._next_batch()
            delay = await self._failed(batch, failed, attempt, delay)
            attempt += 1
        while self._pending and self.rows_committed < target:
            if self._unavailable is not None:
                raise AuditUnavailable(self._unavailable)
            batch = self._next_batch()
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
            logger.error("activity log file %s was %s; restart the bus", self._store.path, exc)
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
