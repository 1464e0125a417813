"""The activity logs of several bus nodes read as one: rows merged by time, each log verified.

Each node of a cluster (:mod:`bus.transports.cluster`) keeps its own SQLite log and hash chain,
so no node can rewrite another's history; an auditor reads them together here.
``bcpbus audit --db a.db --db b.db`` prints the rows of every log that pass the filters in time
order, each with the node that wrote it, so ``--message-id ID`` follows one message from the
node that accepted it (``send_start`` ... ``cluster_out``) to every node that delivered it
(``cluster_in``, ``process_finish``). ``bcpbus audit verify`` with several ``--db`` checks each
chain on its own: a merge is only as good as every log in it.

Rows are ordered by their ``ts``, then by node name, then by id: each node's clock orders its
own rows, and the hybrid epochs (a node delivering a forwarded message gives it an epoch above
the sender node's) keep cause before effect where clocks disagree by less than a hop.
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
    merged.sort(key=lambda row: (str(row.get("ts")), row["node"], row.get("id") or 0))
    return merged if limit is None else merged[:limit]


def verify_each(
    dbs: Sequence[str | os.PathLike[str]], **options: Any
) -> list[tuple[str, Verification]]:
    """Verify each log's chain (:func:`bus.log.audit.verify` with ``options``); return each
    node's name with its result, in the order given."""
    return [(node_name(db), verify(db, **options)) for db in dbs]
