"""The activity logs of several bus nodes read as one: rows merged by time, each log verified.

Each node of a cluster (:mod:`bus.transports.cluster`) keeps its own SQLite log and hash chain,
so no node can rewrite another's history; an auditor reads them together here.
``bcpbus audit --db a.db --db b.db`` prints the rows of every log that pass the filters in time
order, each with the node that wrote it, so ``--message-id ID`` follows one message from the
node that accepted it (``send_start`` ... ``cluster_out``) to every node that delivered it
(``cluster_in``, ``process_finish``). ``bcpbus audit verify`` with several ``--db`` checks each
chain on its own: a merge is only as good as every log in it.

Rows are ordered by their ``ts``, then by node name, then by id: each node's clock orders its
own rows. One correction keeps cause before effect where the nodes' clocks, or the order in
which they read the stream, disagree: a message's rows on the nodes it crossed are never placed
before its ``send_start`` on the node that accepted it (the one without a ``cluster_in`` row for
it). A message has the same epoch on every node (:mod:`bus.core.epochs`).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .audit import Verification, query_rows, read_only, verify

__all__ = ["merged_rows", "node_name", "verify_each"]


def node_name(db: str | os.PathLike[str]) -> str:
    """The cluster node that wrote ``db`` (its last ``cluster_node started`` row), else the
    file's name without its suffix (a bus that was never a node)."""
    try:
        with read_only(db) as conn:
            row = conn.execute(
                "SELECT actor FROM activity_log WHERE event = 'cluster_node' "
                "AND status = 'started' ORDER BY id DESC LIMIT 1"
            ).fetchone()
    except sqlite3.Error:
        row = None
    return str(row[0]) if row is not None and row[0] else Path(db).stem


def merged_rows(
    dbs: Sequence[str | os.PathLike[str]], *, limit: int | None = 1000, **filters: Any
) -> list[dict[str, Any]]:
    """The rows of every log in ``dbs`` that pass ``filters``, in time order.

    Args:
        dbs: the nodes' activity logs.
        limit: the most rows returned over all logs (the earliest); None for all.
        filters: as :func:`bus.log.audit.query_rows` takes them (``message_id``, ``topic``,
            ``actor``, ``since``, ``until``, ``event``).

    Returns:
        One dict per row, ``node`` first, then every column of ``activity_log``.

    Raises:
        ValueError: a log is not an activity log, or a filter is malformed; show it to the user.
        FileNotFoundError: a log does not exist.
    """
    merged: list[dict[str, Any]] = []
    for db in dbs:
        node = node_name(db)
        for row in query_rows(db, limit=limit, **filters):
            merged.append({"node": node, **row})
    starts = _origin_starts(merged)
    merged.sort(key=lambda row: _order(row, starts))
    return merged if limit is None else merged[:limit]


def _origin_starts(rows: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """``{message_id: (origin node, ts of its send_start there)}`` for the messages whose
    accepting node is known: the one node with a ``send_start`` and no ``cluster_in``."""
    starts: dict[str, dict[str, str]] = {}
    relayed: dict[str, set[str]] = {}
    for row in rows:
        message_id = row.get("message_id")
        if not message_id:
            continue
        if row["event"] == "send_start":
            starts.setdefault(message_id, {})[row["node"]] = str(row.get("ts"))
        elif row["event"] == "cluster_in":
            relayed.setdefault(message_id, set()).add(row["node"])
    origins: dict[str, tuple[str, str]] = {}
    for message_id, by_node in starts.items():
        candidates = set(by_node) - relayed.get(message_id, set())
        if len(candidates) == 1:
            (origin,) = candidates
            origins[message_id] = (origin, by_node[origin])
    return origins


def _order(row: dict[str, Any], starts: dict[str, tuple[str, str]]) -> tuple[str, int, str, int]:
    """Sort key: time, but another node's row of a message not before its origin's start."""
    ts, rank = str(row.get("ts")), 0
    origin = starts.get(row.get("message_id") or "")
    if origin is not None and row["node"] != origin[0] and ts <= origin[1]:
        ts, rank = origin[1], 1
    return ts, rank, row["node"], row.get("id") or 0


def verify_each(
    dbs: Sequence[str | os.PathLike[str]], **options: Any
) -> list[tuple[str, Verification]]:
    """Verify each log's chain (:func:`bus.log.audit.verify` with ``options``); return each
    node's name with its result, in the order given."""
    return [(node_name(db), verify(db, **options)) for db in dbs]
