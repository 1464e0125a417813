"""The console's audit page: what crossed each channel, refusals, one query's story, the chain.

Everything is read from the activity log with the functions behind ``bcpbus audit``
(:mod:`bus.log.audit`), on a thread, read-only: bits per channel and their history as a chart
(:mod:`peers.console.charts`), refusals by reason, one query's timeline (the question, every
raw answer the reader sent, escaped, the value delivered, every row), and the log's head; and
from the agent definitions, each channel's risk report (``bcpbus agents check``).
Verifying the whole chain reads every row (about nine seconds a million rows), so it runs when
someone asks (``POST /console/audit/verify``), one at a time, and the page shows the latest
result with its time.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from bus.log import audit

from ..gateway.risk_command import check
from .charts import bits_history, draw

if TYPE_CHECKING:
    from .app import Console

__all__ = ["AuditPage", "Checked"]

logger = logging.getLogger("peers.console")

_MAX_QUERY_ID = 128


@dataclass(frozen=True)
class Checked:
    """The latest chain verification: when, and what it found."""

    at: str
    ok: bool
    rows: int
    head: str | None
    problems: tuple[str, ...]


class AuditPage:
    """``GET /console/audit`` and ``POST /console/audit/verify`` of one console."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.checked: Checked | None = None
        """The latest verification, if any was asked for."""
        self._verifying = asyncio.Lock()

    async def page(self, request: Request) -> Response:
        """The page; ``?query=ID`` adds that query's timeline."""
        console = self.console
        viewer = await console.viewer(request)
        if viewer is None:
            return console.to_signin("ended")
        query_id = request.query_params.get("query", "").strip()[:_MAX_QUERY_ID]
        data = await asyncio.to_thread(self._read, query_id)
        flash, viewer.session.flash = viewer.session.flash, []
        return console.render(
            "audit.html",
            viewer=viewer,
            flash=flash,
            query_id=query_id,
            checked=self.checked,
            verifying=self._verifying.locked(),
            **data,
        )

    def _read(self, query_id: str) -> dict[str, Any]:
        db = self.console.bus.log.path
        histories = bits_history(db)
        channels = [(history, draw(history)) for history in histories]
        try:
            row_id, chain = audit.head(db)
            head: str | None = f"{row_id}:{chain}"
        except ValueError:
            head = None
        detail = audit.query_detail(db, query_id) if query_id else None
        risk = None
        if self.console.agents_dir is not None:
            try:
                risk = check(self.console.agents_dir, query_ttl=self.console.query_ttl)
            except (OSError, ValueError) as exc:
                logger.warning("console: no risk report: %s", exc)
        if detail is not None:
            detail["rows"] = [_timeline_row(row) for row in detail["rows"]]
        return {
            "channels": channels,
            "refusals": audit.refusals_per_reason(db),
            "head": head,
            "detail": detail,
            "risk": risk,
            "to_json": _json,
        }

    async def verify(self, request: Request) -> Response:
        """Verify the chain now (unless a verification runs already), then show the page."""
        console = self.console
        viewer = await console.viewer(request)
        if viewer is None:
            return console.to_signin("ended")
        if await console._checked_form(request, viewer) is None:
            return console.render("error.html", 403, message="The form expired: reload the page.")
        if not self._verifying.locked():
            async with self._verifying:
                self.checked = await asyncio.to_thread(self._verify)
        return RedirectResponse(f"{console.base}/audit#chain", status_code=303)

    def _verify(self) -> Checked:
        log = self.console.bus.log
        at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        try:
            # A version-1 log's HMAC key exists only where an earlier bus wrote one; a log
            # chained since (version 2) needs no secret to check.
            key_file = log.key_file if log.key_file.exists() else None
            found = audit.verify(log.path, key_file)
        except (OSError, ValueError) as exc:
            return Checked(at, False, 0, None, (f"cannot verify: {exc}",))
        head = str(found.head) if found.head else None
        problems = tuple(
            f"row {p.row}: {p.why}" if p.row is not None else p.why for p in found.problems[:20]
        )
        return Checked(at, found.ok, found.rows, head, problems)


def _timeline_row(row: dict[str, Any]) -> dict[str, Any]:
    """One row of a query's story as the timeline shows it: the columns, the payload decoded."""
    payload: Any = row.get("payload_json")
    try:
        payload = json.loads(payload) if isinstance(payload, str) else payload
    except ValueError:
        pass
    return {
        **{k: v for k, v in row.items() if k not in ("payload_json", "chain")},
        "payload": payload,
    }


def _json(value: Any) -> str:
    """A value as readable JSON text (non-ASCII kept; the template escapes and reveals it)."""
    return json.dumps(value, ensure_ascii=False, indent=1, sort_keys=False)
