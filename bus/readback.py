"""Reading messages back from the activity log: ``fetchMessages`` and ``GET /v1/messages``.

:class:`Readback` is the I/O half of a read. Whether a peer may read a pattern, and how many
messages a page holds, is decided in :mod:`bus.core.requests` (``admit_fetch``); what it may
receive of each message is :mod:`bus.log.fetch`'s. This module commits first (every message
given an epoch so far is then on disk or aborted, so none can turn up later below the page's
end), reads through :class:`bus.log.history.History`, and logs the read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from .core import requests
from .core.actions import Action
from .core.epochs import Epochs
from .core.errors import AuditUnavailable, ShuttingDown
from .core.logevents import LogEvent
from .core.policy import Grants
from .log.activity import ActivityLog
from .log.fetch import FetchFilter, FetchResult, Page, check_since
from .log.history import History
from .ops.config import Limits, LogContent

__all__ = ["CATCH_UP_WAIT", "Readback"]

logger = logging.getLogger("bus.server")

CATCH_UP_WAIT = 5.0
"""Seconds a read on a cluster node waits for the node to reach a ``sinceEpoch`` beyond what it
has read of the cluster's stream (a cursor from a node ahead of it) before it refuses it."""


class Readback:
    """Reads one bus's messages back for peers, with the policy's limits."""

    def __init__(
        self,
        log: ActivityLog,
        history: History,
        epochs: Epochs,
        limits: Limits,
        *,
        log_content: LogContent,
        carry: Callable[[list[Action]], Any],
        closing: Callable[[], bool],
    ) -> None:
        self.log = log
        self.limits = limits
        self.log_content: LogContent = log_content
        self._history = history
        self._epochs = epochs
        self._carry = carry
        """Carries out a refusal's rows and raises its error (:meth:`bus.server.Bus.carry`)."""
        self._closing = closing
        """Tells whether the bus is closing: a read is then refused -32007."""
        self._read_on = asyncio.Event()
        epochs.on_read = self._read_on.set

    async def fetch(
        self,
        grants: Grants,
        pattern: str,
        since_epoch: int,
        limit: int | None = None,
        *,
        only: FetchFilter | None = None,
        rpc_id: str | None = None,
    ) -> FetchResult:
        """The messages after ``since_epoch`` on topics matching ``pattern`` that the peer with
        ``grants`` may receive now, oldest first: ``fetchMessages``, for any transport.

        What "may receive" means is :mod:`bus.log.fetch`'s (the policy for ``pattern``, the taint
        rule from each sender, no ``bcp:`` topic but for the declassifier, not its own). The
        read is logged (a ``fetch`` row, committed before this returns).

        Args:
            grants: the reading peer's grants, as the policy gives them now.
            pattern: a topic pattern (``*`` segments allowed).
            since_epoch: the last epoch already seen; 0 for the oldest kept.
            limit: the most messages to return; capped by ``max_fetch_messages`` (None: the cap).
            only: further conditions on each message (type, correlation id, sender, time).
            rpc_id: the request's id, for the log rows.

        Raises:
            InvalidParams: ``pattern`` is malformed.
            Forbidden: the policy does not let this peer subscribe to ``pattern`` (logged).
            EpochNotKept: ``since_epoch`` is outside what the log keeps.
            ContentNotKept: the log keeps only digests (``log_content: digest``), or reached a
                message kept as a digest by an earlier run.
            AuditUnavailable: the log could not commit, or could not be read.
            ShuttingDown: the bus is closing.
        """
        admission = self._admitted(grants, pattern, limit, rpc_id)
        pattern = admission.pattern
        upto = await self._reach(since_epoch)
        # Every message given an epoch so far is then committed (or aborted): none can be
        # missing below upto and turn up later.
        await self.log.commit()
        page = Page(grants, pattern, since=since_epoch, limit=admission.limit, only=only)
        more = await self._read(page, since_epoch, upto)
        result = page.result(more=more, upto=upto)
        await self._logged(result, page, since_epoch, rpc_id)
        return result

    async def _reach(self, since_epoch: int) -> int:
        """The page's upper bound: the last epoch given. On a cluster node, first wait
        (:data:`CATCH_UP_WAIT` at most) until this node has read the cluster's stream as far as
        ``since_epoch``: a cursor from a node further on is then exact here too (a cursor
        between two stream messages, given by a node while cut off, is the earlier one's)."""
        epochs = self._epochs
        if epochs.base is None or since_epoch <= epochs.last:
            return epochs.last
        wanted = epochs.seq_of(since_epoch)
        with contextlib.suppress(TimeoutError):  # then check_since refuses it, as it is
            async with asyncio.timeout(CATCH_UP_WAIT):
                while wanted > epochs.read():
                    self._read_on.clear()
                    await self._read_on.wait()
        return max(epochs.last, since_epoch) if wanted <= epochs.read() else epochs.last

    async def _logged(
        self, result: FetchResult, page: Page, since_epoch: int, rpc_id: str | None
    ) -> None:
        """Record the read (a ``fetch`` row: what was asked, what came back, what was withheld)
        and commit it."""
        self.log.record(
            LogEvent.FETCH,
            rpc_id=rpc_id,
            actor=page.reader.client_id,
            topic=page.pattern,
            status=f"{len(result.messages)} messages",
            payload={
                "sinceEpoch": since_epoch,
                "nextEpoch": result.next_epoch,
                "withheld": page.withheld,
            },
        )
        await self.log.commit()

    def _admitted(
        self, grants: Grants, pattern: str, limit: int | None, rpc_id: str | None
    ) -> requests.FetchAdmission:
        """What the core admits of this read (:func:`bus.core.requests.admit_fetch`); a refusal
        is carried out (its row, its error raised)."""
        if self._closing():
            raise ShuttingDown()
        admission = requests.admit_fetch(
            grants,
            pattern,
            limit,
            rpc_id=rpc_id,
            digests_only=self.log_content == "digest",
            cap=self.limits.max_fetch_messages,
        )
        if admission.actions:
            self._carry(admission.actions)
        return admission

    async def _read(self, page: Page, since_epoch: int, upto: int) -> bool:
        """Fill ``page`` from the log up to epoch ``upto``; return whether more is kept.

        Raises:
            EpochNotKept: ``since_epoch`` is outside what the log keeps.
            AuditUnavailable: the log could not be read.
        """
        try:
            check_since(since_epoch, await self._history.oldest(), upto)
            return await self._history.fill(page, upto=upto, topic=_literal(page.pattern))
        except sqlite3.Error as exc:
            logger.error("fetch: reading the activity log failed: %r", exc)
            raise AuditUnavailable(
                "Activity log unavailable: it could not be read; retry later"
            ) from exc


def _literal(pattern: str) -> str | None:
    """``pattern`` if it is a concrete topic (read through the topic index), else None."""
    return None if "*" in pattern else pattern
