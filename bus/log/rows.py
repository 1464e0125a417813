"""One activity-log row as the writer buffers, chains and inserts it: :class:`LogRow`."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from typing import Any, NamedTuple

from ..core.logevents import LogEvent

__all__ = [
    "COLUMNS",
    "Clock",
    "LogRow",
    "encode_payload",
    "refused_for_content",
    "stamp",
    "unwritable",
]

logger = logging.getLogger("bus.log.activity")


class LogRow(NamedTuple):
    """A row :meth:`bus.log.activity.ActivityLog.record` buffered, its columns by name.

    Every value is text or NULL (``epoch`` as decimal text, like ``rpc_id``), so the chain
    encodes each row on its all-text path; ``id`` and ``chain`` are assigned when the row is
    inserted. Being a tuple, a row binds to an ``INSERT`` as it is, in :data:`COLUMNS` order.
    """

    ts: str
    event: str
    message_id: str | None
    rpc_id: str | None
    actor: str | None
    topic: str | None
    status: str | None
    payload_json: str | None
    error: str | None
    # Per message: its epoch (every row of it) and the trace id of its traceparent.
    epoch: str | None
    trace_id: str | None


COLUMNS: tuple[str, ...] = LogRow._fields
"""The columns :meth:`~bus.log.activity.ActivityLog.record` fills, in the order of a
:class:`LogRow` (``id`` and ``chain`` are assigned when it is inserted)."""


def refused_for_content(row: LogRow, exc: BaseException) -> bool:
    """Whether SQLite refused ``row``, written alone, for what it holds, so that a
    ``row_unwritable`` row may stand for it.

    It did if a column is not valid text (binding raises :exc:`UnicodeEncodeError`), or if the
    error is one a row can cause: a constraint or trigger (:exc:`sqlite3.IntegrityError`), a
    value too big (:exc:`sqlite3.DataError`), a value that cannot be bound. It did not for
    :exc:`sqlite3.OperationalError` (a read-only, locked or failing file) or a bare
    :exc:`sqlite3.DatabaseError` (a corrupt file): a good row must not be replaced because the
    database failed while it was alone; the batch fails and is retried instead.
    """
    if not all(_is_text(value) for value in row):
        return True
    return not isinstance(exc, sqlite3.OperationalError | sqlite3.InternalError) and (
        type(exc) is not sqlite3.DatabaseError
    )


def unwritable(row: LogRow, exc: BaseException) -> list[LogRow]:
    """The ``row_unwritable`` rows that may stand for ``row``, best first: one that keeps the
    columns that are valid text, and one that keeps only the timestamp.

    A ``row_unwritable`` row stands for a row SQLite could not store (text that is not valid
    Unicode, such as a lone surrogate). It keeps the original's ``ts`` and those of
    ``message_id``, ``rpc_id``, ``actor``, ``topic`` and ``status`` that are valid text;
    ``error`` says why the row was refused; ``payload_json`` is ``{"event": ..., "columns":
    [...], "sha256": ...}``: the original event (non-text characters as ``\\uXXXX`` escapes),
    the columns that were not valid text, and the SHA-256 of ``json.dumps(list(row)).encode()``,
    the original row's columns in :data:`COLUMNS` order as a JSON array with Python's default
    separators and ASCII escapes.
    """
    bad = [name for name, value in zip(COLUMNS, row, strict=True) if not _is_text(value)]
    payload = _ENCODER.encode(
        {
            "event": _escape(row.event),
            "columns": bad,
            "sha256": hashlib.sha256(json.dumps(list(row)).encode()).hexdigest(),
        }
    )
    reason = _escape(f"{type(exc).__name__}: {exc}")[:500]
    bare = LogRow._make(
        (row.ts, LogEvent.ROW_UNWRITABLE.value, *[None] * 5, payload, reason, None, None)
    )
    kept = {
        name: value
        for name in ("message_id", "rpc_id", "actor", "topic", "status", "epoch", "trace_id")
        if _is_text(value := getattr(row, name))
    }
    return [bare._replace(**kept), bare]


def _is_text(value: str | None) -> bool:
    """Whether SQLite can store ``value``: NULL, or a str that is valid Unicode."""
    if value is None:
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _escape(text: str) -> str:
    """``text`` with what is not valid Unicode (lone surrogates) as ``\\uXXXX`` escapes."""
    return text.encode("utf-8", "backslashreplace").decode()


class Clock:
    """Row timestamps: the wall clock, held while it is behind the last stamp given."""

    def __init__(self) -> None:
        self.last = 0  # microseconds since the epoch of the last stamp
        # The formatted date and time of the last second stamped: every row needs a timestamp,
        # and formatting only the microseconds is a third of the cost of datetime.isoformat().
        self.second: int | None = None
        self.prefix = ""

    def now(self) -> str:
        micros = time.time_ns() // 1000
        if micros < self.last:
            # The clock was stepped back: rows must stay in time order for audit --since.
            micros = self.last
        self.last = micros
        return self.format(micros)

    def format(self, micros: int) -> str:
        seconds, micros = divmod(micros, 1_000_000)
        if seconds != self.second:
            self.second = seconds
            self.prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(seconds))
        return f"{self.prefix}{micros:06d}Z"


_clock = Clock()


def stamp() -> str:
    """Now in UTC, ``2026-05-09T07:35:25.123456Z``: fixed width, so text order is time order;
    never earlier than the previous stamp, so row order is time order too."""
    return _clock.now()


# One encoder for every row: json.dumps() with options builds a new encoder on each call.
# allow_nan=False: NaN is not JSON, and SQLite's json functions reject the whole text.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_payload(payload: Any) -> str:
    try:
        return _ENCODER.encode(payload)
    except (TypeError, ValueError) as exc:
        # An audit row must not be lost for its payload's sake: keep a readable form of it.
        logger.warning("activity payload is not JSON (%s); stored as its repr", exc)
        return _ENCODER.encode(repr(payload))
