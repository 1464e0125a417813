"""Open an activity log file: create it 0600, create or migrate its schema, check its chain.

:func:`prepare` runs once per :class:`~bus.log.activity.ActivityLog` on its database thread, in one
``BEGIN IMMEDIATE`` transaction, so that processes opening the same file at once take turns:

- a new file gets the schema and a ``chain_start`` row (``status`` ``new``);
- a file written before the log was chained gets the missing columns (``ALTER TABLE ... ADD
  COLUMN``: any column the schema names that the table lacks, so columns added later migrate
  the same way) and a ``chain_start`` row (``migrated``) that binds every row before it;
- a file chained by version 1 (an HMAC, :mod:`bus.log.chain_v1`) is verified whole with its key,
  then a version-2 ``chain_start`` row (``upgraded``) binds every row before it, so that from
  then on those rows are checked without the key;
- a chained file has its triggers checked against the schema (one that was dropped or changed
  is not silently created again) and its chain's tail verified (:data:`TAIL_ROWS` rows and the
  latest ``chain_start``, so opening a large log stays fast; ``bcpbus audit verify`` checks all).

A problem raises :class:`~bus.log.chain.ChainBroken` naming the first bad row, unless
``accept_broken``: then the whole log is verified, the triggers are created again, and a
``chain_start`` row (``broken_log_accepted``) records the first bad row and starts a new segment.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sqlite3
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.presence import BUS_CLIENT_ID
from .chain import CHAIN_START, VERSION, ChainBroken, Chainer, Head, Problem, Verifier
from .chain_v1 import LEGACY_VERSION, load_key

__all__ = [
    "TAIL_ROWS",
    "Opened",
    "check_triggers",
    "create_file",
    "prepare",
    "scan",
    "table_columns",
]

logger = logging.getLogger("bus.log.activity")

TAIL_ROWS = 10_000
"""Rows at the end of the log whose chain is checked when it is opened."""

TABLE = "activity_log"


@dataclass(frozen=True)
class Opened:
    """What :func:`prepare` found and did."""

    head: Head
    """The last row's id and ``chain`` once opened."""
    started: str | None
    """The ``status`` of the ``chain_start`` row it wrote (``new``, ``migrated``, ``upgraded``,
    ``broken_log_accepted``), or None when it went on with the chain it found."""


def create_file(path: Path) -> None:
    """Create an empty database file at ``path``, mode 0600, unless there is one.

    SQLite creates the ``-wal`` and ``-shm`` files with the mode of the database file, so all
    three stay private to the owner. An existing file keeps its mode; a warning says if others
    may read it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        with contextlib.suppress(OSError):
            if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                logger.warning("activity log %s may be read by others: chmod 600 it", path)


# The schema the writer expects


@dataclass(frozen=True)
class _Schema:
    columns: tuple[tuple[str, str], ...]  # name, declared type
    objects: tuple[tuple[str, str, str], ...]  # type, name, sql: indexes and triggers


@functools.cache
def _expected(schema: str) -> _Schema:
    """What ``schema`` creates, read back from an in-memory database: SQLite's own text."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        conn.executescript(schema)
        columns = tuple(
            (name, kind) for _, name, kind, *_ in conn.execute(f"PRAGMA table_info({TABLE})")
        )
        objects = tuple(
            conn.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE tbl_name = ? AND sql IS NOT NULL "
                "AND type IN ('index', 'trigger') ORDER BY rowid",
                (TABLE,),
            )
        )
        [(create,)] = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (TABLE,))
    return _Schema(columns, (("table", TABLE, create), *objects))


def table_columns(conn: sqlite3.Connection) -> list[str]:
    """The names of the ``activity_log`` columns, in table order."""
    return [name for _, name, *_ in conn.execute(f"PRAGMA table_info({TABLE})")]


def check_triggers(conn: sqlite3.Connection, schema: str) -> list[Problem]:
    """Name each trigger of ``schema`` that the database lacks or holds changed."""
    existing = dict(
        conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?", (TABLE,)
        )
    )
    problems = []
    for kind, name, sql in _expected(schema).objects:
        if kind == "trigger" and existing.get(name) != sql:
            change = "dropped" if name not in existing else "changed"
            problems.append(Problem(None, f"its trigger {name} was {change}"))
    return problems


def scan(conn: sqlite3.Connection, verifier: Verifier, since: int = 0) -> None:
    """Feed every row with ``id >= since`` to ``verifier``, in id order."""
    names = table_columns(conn)
    verifier.columns(names)
    quoted = ",".join(f'"{name}"' for name in names)
    check = verifier.check
    for values in conn.execute(f"SELECT {quoted} FROM {TABLE} WHERE id >= ? ORDER BY id", (since,)):
        check(values)


# Preparing a file


def prepare(
    conn: sqlite3.Connection,
    path: Path,
    *,
    schema: str,
    columns: Sequence[str],
    key_path: Path,
    accept_broken: bool,
    ts: str,
) -> Opened:
    """Create, migrate and check the log behind ``conn`` (see the module docstring).

    Args:
        conn: an autocommit connection (``isolation_level=None``) to the file at ``path``.
        schema: the DDL of the table, its indexes and its triggers.
        columns: the columns the writer fills (its rows' order), ``id`` and ``chain`` excluded.
        key_path: the version-1 key file: read only to check a log an earlier version chained
            before it is chained on (version 2 needs no key).
        ts: the timestamp of a ``chain_start`` row written now.

    Raises:
        ChainBroken: a trigger is missing or changed, or the chain's tail does not verify, or
            the key is missing for a log chained by version 1; the message names the first bad
            row.
        ValueError: the key file does not hold a key.
        sqlite3.Error, OSError: the file cannot be read or written.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        opened = _Preparation(conn, path, schema, columns, ts).run(key_path, accept_broken)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return opened


class _Preparation:
    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        schema: str,
        columns: Sequence[str],
        ts: str,
    ) -> None:
        self.conn, self.path, self.columns, self.ts = conn, path, columns, ts
        self.schema_text, self.schema = schema, _expected(schema)

    def run(self, key_path: Path, accept_broken: bool) -> Opened:
        problems = self._schema()
        start = self._latest_start()
        last = self._last()
        if start is None and last is None:
            self._create_triggers()  # nothing to protect yet: a missing one is no evidence
            return self._start("new", None, {})
        if start is None:
            return self._migrate(None, problems, accept_broken, "migrated")
        if start[1].get("chain") == LEGACY_VERSION:
            key = self._legacy_key(key_path, start, accept_broken)
            return self._migrate(key, problems, accept_broken, "upgraded")
        problems = self._tail(start) + problems  # a bad row first, then the triggers
        if not problems:
            assert last is not None
            return Opened(Head(last[0], str(last[1])), None)
        if not accept_broken:
            first = problems[0]
            raise ChainBroken(self.path, first.row, first.why)
        return self._accept(problems)

    def _schema(self) -> list[Problem]:
        """Create what is missing; report a trigger that was dropped or changed."""
        conn = self.conn
        existing = {
            name: sql
            for name, sql in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE tbl_name = ?", (TABLE,)
            )
        }
        if TABLE not in existing:
            for _, _, sql in self.schema.objects:
                conn.execute(sql)
            return []
        have = set(table_columns(conn))
        for name, kind in self.schema.columns:
            if name not in have:
                # No default: rows written before the column read NULL and keep their hash.
                conn.execute(f'ALTER TABLE {TABLE} ADD COLUMN "{name}" {kind}')
                logger.info("activity log %s: added column %s", self.path, name)
        for kind, name, sql in self.schema.objects[1:]:
            if kind == "index" and name not in existing:
                conn.execute(sql)
        return check_triggers(conn, self.schema_text)

    def _latest_start(self) -> tuple[int, dict[str, Any]] | None:
        found = self.conn.execute(
            f"SELECT id, payload_json FROM {TABLE} WHERE event = ? AND chain IS NOT NULL "
            "ORDER BY id DESC LIMIT 1",
            (CHAIN_START,),
        ).fetchone()
        if found is None:
            return None
        try:
            payload = json.loads(found[1])
        except (TypeError, ValueError):
            payload = {}
        return found[0], payload if isinstance(payload, dict) else {}

    def _last(self) -> tuple[int, str | None] | None:
        found = self.conn.execute(f"SELECT id, chain FROM {TABLE} ORDER BY id DESC LIMIT 1")
        row: tuple[int, str | None] | None = found.fetchone()
        return row

    def _legacy_key(
        self, key_path: Path, start: tuple[int, dict[str, Any]], accept_broken: bool
    ) -> bytes | None:
        """The version-1 key that checks the log before it is upgraded; None if it is missing
        and the break is accepted (the rows are then bound unchecked)."""
        try:
            return load_key(key_path)
        except FileNotFoundError:
            if accept_broken:
                return None
            raise ChainBroken(
                self.path,
                None,
                f"it is chained by an earlier version (chain 1, key id {start[1].get('key_id')}) "
                f"and its key {key_path} is missing: restore it from its backup or give its path "
                "(--audit-key), so that the log is checked before this version chains it on",
            ) from None

    def _tail(self, start: tuple[int, dict[str, Any]]) -> list[Problem]:
        start_id, payload = start
        if payload.get("chain") != VERSION:
            why = (
                f"it starts a chain of version {payload.get('chain')!r}, which this bcpbus does "
                f"not know (it writes version {VERSION}): run the bcpbus that wrote it"
            )
            return [Problem(start_id, why)]
        [(last_id,)] = self.conn.execute(f"SELECT MAX(id) FROM {TABLE}")
        since = max(start_id, last_id - TAIL_ROWS + 1)
        verifier = Verifier(start=since)
        if since > start_id:
            before = self.conn.execute(
                f"SELECT id, chain FROM {TABLE} WHERE id < ? ORDER BY id DESC LIMIT 1", (since,)
            ).fetchone()
            verifier.resume(before)
        else:
            verifier.resume(None)
        scan(self.conn, verifier, since)
        return verifier.problems

    def _migrate(
        self, key: bytes | None, problems: list[Problem], accept_broken: bool, reason: str
    ) -> Opened:
        verifier = Verifier(key)
        scan(self.conn, verifier)
        problems = verifier.problems + problems
        if problems and not accept_broken:
            first = problems[0]
            raise ChainBroken(self.path, first.row, first.why)
        if problems:
            return self._accept(problems, verifier)
        logger.warning(
            "activity log %s: chained (version %d) from now on; the chain_start row binds the %d "
            "rows before it",
            self.path,
            VERSION,
            verifier.rows,
        )
        return self._start(reason, verifier, {})

    def _accept(self, problems: list[Problem], verifier: Verifier | None = None) -> Opened:
        if verifier is None:
            verifier = Verifier()
            scan(self.conn, verifier)
        first = (verifier.problems or problems)[0]
        self._create_triggers()
        logger.error(
            "activity log %s: broken at row %s (%s); a new chain segment starts "
            "(--accept-broken-log)",
            self.path,
            first.row,
            first.why,
        )
        broken = {"row": first.row, "why": first.why}
        return self._start("broken_log_accepted", verifier, {"broken": broken})

    def _create_triggers(self) -> None:
        for kind, name, sql in self.schema.objects[1:]:
            if kind == "trigger":
                self.conn.execute(f'DROP TRIGGER IF EXISTS "{name}"')
                self.conn.execute(sql)

    def _start(self, reason: str, verifier: Verifier | None, extra: dict[str, Any]) -> Opened:
        last = self._last()
        previous = None
        if verifier is not None and verifier.rows:
            previous = {
                "rows": verifier.rows,
                "last_id": last[0] if last else None,
                "chain": verifier.run.hex(),
            }
        payload = {"chain": VERSION, "previous": previous, **extra}
        fields = {
            "ts": self.ts,
            "event": CHAIN_START,
            "actor": BUS_CLIENT_ID,
            "status": reason,
            "payload_json": json.dumps(payload, separators=(",", ":"), sort_keys=True),
        }
        row = tuple(fields.get(name) for name in self.columns)
        row_id = (last[0] if last else 0) + 1
        params, chain = Chainer(self.columns).start(row, row_id)
        names = ",".join(f'"{name}"' for name in ("id", *self.columns, "chain"))
        marks = ",".join("?" * len(params))
        self.conn.execute(f"INSERT INTO {TABLE} ({names}) VALUES ({marks})", params)
        return Opened(Head(row_id, chain), reason)
