"""The activity log's table, indexes and triggers, and the statements the writer runs on it.

The writer inserts each batch with one multi-row ``INSERT`` (:func:`statement`), padded to a few
sizes so that sqlite3's cache of prepared statements stays small.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
from typing import Any

from .rows import COLUMNS

__all__ = [
    "APPEND_ONLY",
    "BUSY_TIMEOUT",
    "INSERTED",
    "LAST_ROW",
    "SCHEMA",
    "max_rows_per_statement",
    "statement",
    "statement_rows",
]

APPEND_ONLY = "activity_log is append-only"

BUSY_TIMEOUT = 5.0
"""Seconds a write waits (on the database thread) for another process's lock."""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS activity_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts TEXT NOT NULL,
    event TEXT NOT NULL,
    message_id TEXT,
    rpc_id TEXT,
    actor TEXT,
    topic TEXT,
    status TEXT,
    payload_json TEXT,
    error TEXT,
    chain TEXT,
    epoch INTEGER,
    trace_id TEXT
);
CREATE INDEX IF NOT EXISTS idx_activity_message_id ON activity_log(message_id);
CREATE INDEX IF NOT EXISTS idx_activity_ts ON activity_log(ts);
-- What fetchMessages reads through (bus.log.history): messages by epoch, by topic then epoch, and
-- the few refused after their epoch was given. Partial: one entry per message, not per row.
CREATE INDEX IF NOT EXISTS idx_activity_epoch ON activity_log(epoch) WHERE event = 'send_start';
CREATE INDEX IF NOT EXISTS idx_activity_topic_epoch ON activity_log(topic, epoch)
WHERE event = 'send_start';
CREATE INDEX IF NOT EXISTS idx_activity_aborted ON activity_log(epoch)
WHERE event = 'send_aborted';
CREATE TRIGGER IF NOT EXISTS activity_log_no_update BEFORE UPDATE ON activity_log
BEGIN
    SELECT RAISE(ABORT, '{APPEND_ONLY}');
END;
CREATE TRIGGER IF NOT EXISTS activity_log_no_delete BEFORE DELETE ON activity_log
BEGIN
    SELECT RAISE(ABORT, '{APPEND_ONLY}');
END;
-- REPLACE deletes the old row without firing delete triggers (unless recursive_triggers is on),
-- so refuse any insert that reuses an existing id before the conflict is resolved.
CREATE TRIGGER IF NOT EXISTS activity_log_no_replace BEFORE INSERT ON activity_log
WHEN EXISTS (SELECT 1 FROM activity_log WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, '{APPEND_ONLY}');
END;
"""
"""The table, its indexes and its triggers. :meth:`ActivityLog.open` creates what is missing and
adds a column a file lacks (a new column must take NULL and have no default, so that the rows
written before it keep their hash), but never creates a dropped trigger again without
``accept_broken``; see :mod:`bus.log.logfile`."""


# The statements the writer runs

LAST_ROW = "SELECT id, chain FROM activity_log ORDER BY id DESC LIMIT 1"
INSERTED = ("id", *COLUMNS, "chain")


def statement(params: list[Any], rows: int) -> tuple[str, list[Any]]:
    """The ``INSERT`` and its parameters for ``rows`` rows of ``params``, padded with rows of
    NULLs, which it skips, to a size of :func:`statement_rows`."""
    size = statement_rows(rows)
    return _insert_sql(size), params + [None] * (len(INSERTED) * (size - rows))


def statement_rows(rows: int, *, up: bool = True) -> int:
    """``rows`` rounded up (or down) to a number with at most 3 significant bits: 1 to 8, 10,
    12, 14, 16, 20, ..., 768, 896.

    sqlite3 keeps the last 128 statements it ran prepared, and a multi-row ``INSERT`` costs
    about 1.6 KiB of SQLite memory per row: one statement per batch size filled that cache with
    whatever sizes the load produced, up to 200 MiB. Padded to these sizes, batches of up to
    896 rows use 35 statements (9 MiB in all), each under a quarter longer than needed.
    """
    shift = max(0, rows.bit_length() - _STATEMENT_BITS)
    fewer = rows >> shift << shift
    return fewer if fewer == rows or not up else fewer + (1 << shift)


_STATEMENT_BITS = 3
"""Significant bits of :func:`statement_rows`' sizes: 4 sizes per doubling."""


@functools.lru_cache(maxsize=128)
def _insert_sql(rows: int) -> str:
    """A multi-row ``INSERT`` for up to ``rows`` rows: rows whose ``id`` is NULL are skipped."""
    values = "(" + ",".join("?" * len(INSERTED)) + ")"
    return (
        f"INSERT INTO activity_log ({','.join(INSERTED)}) SELECT * FROM (VALUES "
        + ",".join([values] * rows)
        + ") WHERE column1 IS NOT NULL"
    )


@functools.cache
def max_rows_per_statement() -> int:
    """How many rows fit in one statement under SQLite's limit on bound parameters."""
    # The limit is compiled into the library (999 before SQLite 3.32, 32766 since).
    with contextlib.closing(sqlite3.connect(":memory:")) as probe:
        limit = probe.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return max(1, limit // len(INSERTED))
