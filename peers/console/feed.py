"""The gateway's approvals as the activity log has them, kept current for the console's pages.

The log is the record: an approval is a ``bcp_approval_requested`` row and, once decided, a
``bcp_approval_decided`` row (the gateway's own, whichever process it runs in; see
:mod:`peers.gateway.core.approvals`). :class:`ApprovalFeed` reads them once from the start, then
every ``interval`` seconds while a page watches it (and whenever a page is loaded) reads the
rows written since the last one it saw: a range of row ids, so each read costs what was written
meanwhile, not the size of the log. Whoever waits on
:meth:`ApprovalFeed.wait_changed` (a page's live stream) wakes when an approval arrives or is
decided, by whomever: the console, ``bcpbus approve``, another approver, the expiry timer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bus.log.audit import read_only

from ..approver import StoredApproval

__all__ = ["ApprovalFeed"]

logger = logging.getLogger("peers.console")

_EVENTS = ("bcp_approval_requested", "bcp_approval_decided")
_BATCH = 1000


class ApprovalFeed:
    """The pending approvals, and the latest decided ones, read from the log at ``db``.

    Args:
        db: the activity log (the bus's SQLite file).
        interval: seconds between two reads of the new rows.
        keep_decided: decided approvals kept to show; older ones are dropped.
        horizon: seconds of the log the first read covers (found through the ``ts`` index), so
            that a long log costs the start nothing; an approval asked earlier was decided or
            expired long since (``approval_timeout`` is minutes), and ``bcpbus approve list
            --all`` still has it.
    """

    def __init__(
        self,
        db: str | Path,
        *,
        interval: float = 0.5,
        keep_decided: int = 50,
        horizon: float = 86400.0,
    ) -> None:
        self.db = Path(db)
        self.interval = interval
        self.keep_decided = keep_decided
        self.horizon = horizon
        self.version = 0
        """Counts the changes; pass it to :meth:`wait_changed`."""
        self._approvals: dict[str, StoredApproval] = {}
        self._after = 0  # the last row id read
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._watchers = 0
        self._watched = asyncio.Event()

    @property
    def approvals(self) -> list[StoredApproval]:
        """Every approval kept, oldest first."""
        return list(self._approvals.values())

    def get(self, approval_id: str) -> StoredApproval | None:
        """The approval with this id, if kept."""
        return self._approvals.get(approval_id)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Keep reading the log every ``interval`` seconds while inside this block (a live
        stream is open); with nobody watching, the feed reads only when :meth:`refresh` is
        called (a page is loaded)."""
        self._watchers += 1
        self._watched.set()
        try:
            yield
        finally:
            self._watchers -= 1
            if not self._watchers:
                self._watched.clear()

    async def start(self) -> None:
        """Start reading the log's approvals (in the background: a page that asks meanwhile
        waits for the first read), then what is written while watched."""
        self._task = asyncio.create_task(self._run(), name="console-feed")

    async def close(self) -> None:
        """Stop reading; wake every waiter. Idempotent."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        async with self._changed:
            self._changed.notify_all()

    async def refresh(self) -> bool:
        """Read the rows written since the last read now; return whether anything changed."""
        async with self._lock:
            try:
                since = None if self._after else _iso(time.time() - self.horizon)
                rows, last = await asyncio.to_thread(_read, self.db, self._after, since)
            except (OSError, sqlite3.Error, ValueError) as exc:
                logger.warning("console: cannot read approvals from %s: %s", self.db, exc)
                return False
            self._after = max(self._after, last)
            changed = self._apply(rows)
        if changed:
            self.version += 1
            async with self._changed:
                self._changed.notify_all()
        return changed

    async def wait_changed(self, version: int, seconds: float) -> int:
        """Wait until :attr:`version` is past ``version``, or ``seconds`` pass; return the
        version then."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await self._changed.wait_for(lambda: self.version != version)
        return self.version

    async def _run(self) -> None:
        await self.refresh()
        while True:
            await self._watched.wait()
            await asyncio.sleep(self.interval)
            await self.refresh()

    def _apply(self, rows: Iterable[tuple[Any, ...]]) -> bool:
        changed = False
        for _id, ts, event, actor, status, payload_json in rows:
            payload = _object(payload_json)
            approval_id = payload.get("approval_id")
            if not isinstance(approval_id, str):
                continue
            if event == "bcp_approval_requested":
                request = payload.get("request")
                self._approvals[approval_id] = StoredApproval(
                    approval_id=approval_id,
                    status="pending",
                    created_ts=str(ts),
                    expires_ts=request.get("expires_at") if isinstance(request, dict) else None,
                    request=request if isinstance(request, dict) else {},
                )
                changed = True
            elif (known := self._approvals.get(approval_id)) is not None:
                self._approvals[approval_id] = replace(
                    known, status=str(status), decided_by=actor, decided_ts=ts, decision=payload
                )
                changed = True
        self._forget_old()
        return changed

    def _forget_old(self) -> None:
        decided = [a for a in self._approvals.values() if a.status != "pending"]
        for approval in decided[: max(0, len(decided) - self.keep_decided)]:
            del self._approvals[approval.approval_id]


def _read(db: Path, after: int, since: str | None) -> tuple[list[tuple[Any, ...]], int]:
    """The approval rows after row ``after`` (and at or after the time ``since``) and the last
    row id, in one read transaction."""
    rows: list[tuple[Any, ...]] = []
    with read_only(db) as conn:
        conn.row_factory = None
        conn.execute("BEGIN")
        (last,) = conn.execute("SELECT COALESCE(MAX(id), 0) FROM activity_log").fetchone()
        start = after
        if since is not None:
            (first,) = conn.execute(
                "SELECT MIN(id) FROM activity_log WHERE ts >= ?", (since,)
            ).fetchone()
            start = max(after, (first or last + 1) - 1)
        while start < last:
            batch = conn.execute(
                "SELECT id, ts, event, actor, status, payload_json FROM activity_log "
                f"WHERE id > ? AND id <= ? AND event IN ({', '.join('?' * len(_EVENTS))}) "
                "ORDER BY id LIMIT ?",
                (start, last, *_EVENTS, _BATCH),
            ).fetchall()
            rows += batch
            if len(batch) < _BATCH:
                break
            start = batch[-1][0]
        conn.execute("COMMIT")
    return rows, int(last)


def _iso(seconds: float) -> str:
    """A time as the log's ``ts`` column writes it (UTC, microseconds), for comparing."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def _object(text: Any) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
