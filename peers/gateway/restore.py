"""Rebuild the gateway's state from the activity log when it starts.

The log is the gateway's one durable record (see :mod:`peers.gateway.state`): bits charged
since each channel's last ``bcp_budget_reset``, the categories each task reached, the query ids
used, recent pushes for rate limits, deliveries still held for offline controllers, sealed values
whose text the log keeps (``bcp_sealed`` rows in ``full`` mode), and the
approvals already decided (a late decision is still refused as ``already_decided``). Queries and
approvals that were pending when the gateway stopped are returned so the gateway can fail them:
a controller is never left waiting in silence.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Container
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas.common import TAINT_LEVELS

from .state import ChannelKey, Decided, GatewayState, Held, Orphans, Seal

if TYPE_CHECKING:
    from .gateway import Gateway

__all__ = ["APPROVALS_VIEW", "Orphans", "create_views", "load_state", "restore"]

APPROVALS_VIEW = """
CREATE VIEW IF NOT EXISTS bcp_approvals AS
SELECT json_extract(r.payload_json, '$.approval_id') AS approval_id,
       COALESCE(d.status, 'pending') AS status,
       r.ts AS created_ts,
       json_extract(r.payload_json, '$.request.expires_at') AS expires_ts,
       json_extract(r.payload_json, '$.request') AS request_json,
       d.actor AS decided_by,
       d.ts AS decided_ts,
       d.payload_json AS decision_json
FROM activity_log AS r
LEFT JOIN activity_log AS d
  ON d.event = 'bcp_approval_decided'
 AND json_extract(d.payload_json, '$.approval_id') = json_extract(r.payload_json, '$.approval_id')
WHERE r.event = 'bcp_approval_requested'
"""
"""Approvals as ``bcpbus approve list`` reads them: derived from the log's rows, so there is
no second, mutable record to drift from the append-only one."""


def create_views(db: str | Path) -> None:
    """Create the gateway's read-only views in the activity log at ``db`` (idempotent).

    Call it after the log is open (the ``activity_log`` table must exist).
    """
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute(APPROVALS_VIEW)
        conn.commit()


def restore(gateway: Gateway, db: str | Path) -> Orphans:
    """Start ``gateway`` from the state its log holds; return what was in flight.

    Call it inside the running event loop before :meth:`Gateway.start`; then pass the result
    to :meth:`Gateway.settle`.
    """
    state = load_state(gateway.channels, db)
    gateway.adopt(state)
    return state.orphans


def load_state(channels: Container[ChannelKey], db: str | Path) -> GatewayState:
    """Read the gateway's budgets, tasks, rates, outbox and decided approvals from the log.

    Rows about channels not in ``channels`` are skipped (an approval's decision is kept on any
    channel). A database without the table (a first start) gives an empty state.
    """
    replay = _Replay(channels)
    for ts, event, status, actor, payload_json in _rows(db):
        replay.apply(ts, event, status, actor, json.loads(payload_json or "{}"))
    return replay.finish()


def _rows(db: str | Path) -> list[tuple[str, str, str | None, str | None, str | None]]:
    if not Path(db).exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        if not conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='activity_log'"
        ).fetchone():
            return []
        return conn.execute(
            "SELECT ts, event, status, actor, payload_json FROM activity_log WHERE event IN ("
            "'bcp_budget_reset','bcp_bits_charged','bcp_query_accepted','bcp_query_failed',"
            "'bcp_delivered','bcp_expired','bcp_held','bcp_approval_requested',"
            "'bcp_approval_decided','bcp_sealed') ORDER BY id"
        ).fetchall()


class _Replay:
    """The gateway's state rebuilt row by row, oldest first."""

    def __init__(self, channels: Container[ChannelKey]) -> None:
        self.channels = channels
        self.state = GatewayState()
        self.open_queries: dict[tuple[str, str], str] = {}
        self.open_approvals: dict[str, str] = {}
        self.held: dict[str, dict[str, Any]] = {}

    def apply(
        self, ts: str, event: str, status: str | None, actor: str | None, payload: dict[str, Any]
    ) -> None:
        state = self.state
        if event == "bcp_approval_decided":
            # Before the channel check: an approval id is the gateway's own, on any channel.
            _remember_decided(state, ts, status, actor, payload)
        key = _channel_key(payload.get("channel"))
        if key is None or key not in self.channels:
            return
        query_id: Any = payload.get("query_id")  # As the row has it: the log is not checked.
        if event == "bcp_budget_reset":
            state.ledger.reset(key)
        elif event == "bcp_bits_charged":
            self._charged(key, ts, payload)
            if (key[0], query_id) in self.open_queries:
                charged = self.state.orphans.charged
                charged[key[0], query_id] = charged.get((key[0], query_id), 0.0) + float(
                    payload.get("bits", 0)
                )
        elif event == "bcp_query_accepted":
            state.tasks.record(key, payload.get("task_id"), int(payload.get("category", 1)))
            state.used_query_ids.add((key[0], query_id))
            self.open_queries[(key[0], query_id)] = key[1]
        elif event in ("bcp_query_failed", "bcp_delivered", "bcp_expired", "bcp_held"):
            if query_id is not None:
                self.open_queries.pop((key[0], query_id), None)
            hold_id: Any = payload.get("hold_id")
            if event == "bcp_held":
                self.held[hold_id] = {**payload, "ts": ts}
            elif hold_id is not None:
                self.held.pop(hold_id, None)
        elif event == "bcp_sealed":
            _remember_sealed(self.state, key, payload)
        elif event == "bcp_approval_requested":
            self.open_approvals[payload["approval_id"]] = f"{key[0]}:{key[1]}"
        elif event == "bcp_approval_decided":
            self.open_approvals.pop(str(payload.get("approval_id")), None)

    def _charged(self, key: ChannelKey, ts: str, payload: dict[str, Any]) -> None:
        bits = float(payload.get("bits", 0))
        cat2 = payload.get("category") == 2 and payload.get("query_id") is not None
        if bits >= 0:
            # A charge with an outcome is a settlement above the reserve, not a new query.
            self.state.ledger.charge(key, bits, cat2=cat2 and "outcome" not in payload)
        else:
            # A refund with an outcome is a query settled to what its outcome costs: it still
            # counts as a Cat-2 query. One without gave everything back (logs before outcomes).
            self.state.ledger.refund(key, -bits, cat2=cat2 and "outcome" not in payload)
        sid = payload.get("subscription_id")
        if sid is not None and bits > 0:
            self.state.rates.record((*key, sid), _epoch(ts))

    def finish(self) -> GatewayState:
        """Return the state, with what was in flight as its orphans and the outbox in order."""
        state, orphans = self.state, self.state.orphans
        orphans.queries = [(c, r, q) for (c, q), r in self.open_queries.items()]
        orphans.charged = {k: v for k, v in orphans.charged.items() if k in self.open_queries}
        for approval_id, pair in self.open_approvals.items():
            controller, reader = pair.split(":", 1)
            orphans.approvals.append((controller, reader, approval_id))
        for hold_id, payload in self.held.items():
            controller, reader = _channel_key(payload["channel"]) or ("", "")
            state.held.append(
                Held(
                    hold_id=hold_id,
                    controller=controller,
                    content=payload["held"],
                    expires_at=_epoch(payload["expires_at"]),
                    reader=reader,
                )
            )
        return state


def _remember_sealed(state: GatewayState, key: ChannelKey, payload: dict[str, Any]) -> None:
    # In digest mode the row keeps only the text's hash: that value cannot be forwarded again.
    handle, text, taint = payload.get("handle"), payload.get("text"), payload.get("taint")
    if not isinstance(handle, str) or not isinstance(text, str) or taint not in TAINT_LEVELS:
        return
    keys = ("query_id", "subscription_id", "field")
    ref: dict[str, str] = {k: str(payload[k]) for k in keys if payload.get(k) is not None}
    expires_at = _epoch(str(payload.get("expires_at")))
    state.sealed[handle] = Seal(handle, key[0], key[1], text, taint, expires_at, ref)


def _remember_decided(
    state: GatewayState, ts: str, status: str | None, actor: str | None, payload: dict[str, Any]
) -> None:
    approval_id = payload.get("approval_id")
    if not isinstance(approval_id, str) or status is None:
        return
    note = payload.get("reason") if status == "expired" else None
    decided = Decided(status, actor or "", ts, note if isinstance(note, str) else None)
    state.decided.remember(approval_id, decided)


def _channel_key(topic: Any) -> tuple[str, str] | None:
    if not isinstance(topic, str):
        return None
    parts = topic.split(":")
    if len(parts) != 3 or parts[0] != "bcp":
        return None
    return parts[1], parts[2]


def _epoch(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
