"""Reading messages back from the activity log: ``fetchMessages`` and ``GET /v1/messages``.

:class:`Readback` is the I/O half of a read. Whether a peer may read a pattern, and how many
messages a page holds, is decided in :mod:`bus.core.requests` (``admit_fetch``); what it may
receive of each message is :mod:`bus.log.fetch`'s. This module commits first (every message
given an epoch so far is then on disk or aborted, so none can turn up later below the page's
end), reads through :class:`bus.log.history.History`, and logs the read.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from .core import requests
from .core.actions import Action
from .core.epochs import Epochs
from .core.errors import AuditUnavailable
from .core.logevents import LogEvent
from .core.policy import Grants
from .log.activity import ActivityLog
from .log.fetch import FetchFilter, FetchResult, Page, check_since
from .log.history import History
from .ops.config import Limits, LogContent

__all__ = ["Readback"]

logger = logging.getLogger("bus.server")


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
    ) -> None:
        self.log = log
        self.limits = limits
        self.log_content: LogContent = log_content
        self._history = history
        self._epochs = epochs
        self._carry = carry
        """Carries out a refusal's rows and raises its error (:meth:`bus.server.Bus.carry`)."""

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
        """
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
        pattern, limit, client_id = admission.pattern, admission.limit, grants.client_id
        upto = self._epochs.last
        # Every message given an epoch so far is then committed (or aborted): none can be
        # missing below upto and turn up later.
        await self.log.commit()
        page = Page(grants, pattern, since=since_epoch, limit=limit, only=only)
        try:
            check_since(since_epoch, await self._history.oldest(), upto)
            more = await self._history.fill(page, upto=upto, topic=_literal(pattern))
        except sqlite3.Error as exc:
            logger.error("fetch: reading the activity log failed: %r", exc)
            raise AuditUnavailable(
                "Activity log unavailable: it could not be read; retry later"
            ) from exc
        result = page.result(more=more, upto=upto)
        self.log.record(
            LogEvent.FETCH,
            rpc_id=rpc_id,
            actor=client_id,
            topic=pattern,
            status=f"{len(result.messages)} messages",
            payload={
                "sinceEpoch": since_epoch,
                "nextEpoch": result.next_epoch,
                "withheld": page.withheld,
            },
        )
        await self.log.commit()
        return result


def _literal(pattern: str) -> str | None:
    """``pattern`` if it is a concrete topic (read through the topic index), else None."""
    return None if "*" in pattern else pattern
