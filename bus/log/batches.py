"""The rows recorded and not yet committed, and the ``commit()`` callers waiting for them.

:class:`Batches` is the bookkeeping under :class:`bus.log.writer.Writer`: which rows go in the
next transaction (:meth:`Batches._next_batch`), and what a committed or failed one releases
(:meth:`Batches._committed`, :meth:`Batches._fail_waiters`). It does no I/O and never waits;
:class:`~bus.log.writer.Writer` decides when a batch goes to the database thread.
"""

from __future__ import annotations

import asyncio
import collections

from ..core.errors import AuditUnavailable
from .rows import LogRow

__all__ = ["BATCH_CONTENT", "Batches"]

BATCH_CONTENT = 4 << 20
"""Characters of ``payload_json`` one batch holds at most beyond its first row."""


class Batches:
    """The rows waiting for the disk, oldest first, and their committers.

    Args:
        batch_max: most rows written in one transaction (see ``ActivityLog``).
    """

    def __init__(self, batch_max: int) -> None:
        self.batch_max = batch_max
        self.batches_committed = 0
        """Transactions committed so far; fewer than ``commit()`` calls when they were grouped."""
        self.rows_committed = 0
        """Rows committed so far by this instance, ``row_unwritable`` replacements included."""
        # Rows recorded and not yet committed, oldest first. A batch is a prefix of it and leaves
        # only once committed, so a failed batch is retried with the next one, in order.
        self._pending: list[LogRow] = []
        self._rows_recorded = 0
        # commit() callers as (rows they wait for, future), in call order, so the targets grow.
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._rows_per_statement = self.batch_max

    def _next_batch(self) -> list[LogRow]:
        """The rows to write next: a prefix of the pending ones, at most
        ``_rows_per_statement``, and no more than :data:`BATCH_CONTENT` characters of content
        past its first row. SQLite copies every value of a statement while it runs, so a batch
        of large messages would double their memory at once; small ones never reach the bound."""
        pending, end = self._pending, min(len(self._pending), self._rows_per_statement)
        size = 0
        for i in range(end):
            content = pending[i].payload_json
            if content is not None:
                size += len(content)
                if size > BATCH_CONTENT and i:
                    return pending[:i]
        return pending[:end]

    def _committed(self, rows: int) -> None:
        """Drop the first ``rows`` pending rows, now in the file, and release the committers
        they were all that was waiting for."""
        del self._pending[:rows]
        self.rows_committed += rows
        self.batches_committed += 1
        while self._waiters and self._waiters[0][0] <= self.rows_committed:
            _, future = self._waiters.popleft()
            if not future.done():  # the caller may have been cancelled
                future.set_result(None)

    def _fail_waiters(self, exc: AuditUnavailable) -> None:
        """Raise ``exc`` in every committer still waiting."""
        # Rows are committed in order, so once a batch fails every remaining waiter needs it.
        while self._waiters:
            _, future = self._waiters.popleft()
            if not future.done():
                future.set_exception(exc)
