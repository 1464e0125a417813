"""The chat peer's own SQLite file: its route to an agent, its retry queue and its history.

One file serves one chat (``meta.chat``); ``bcpbus chat --db FILE`` names it. Everything the chat
must not forget across a crash is here, committed before the chat acts on it:

- ``route``: the agent this chat talks to, from ``route_assigned``, and whether the agent has
  taken this chat's ``configure``. A chat restarted with a route does not ask for a spawn again.
- ``outbox``: every line typed, with its stable ``id``, its state (``pending``: not taken by the
  agent yet; ``delivered``: taken, no reply yet; ``answered``: a ``tg_reply`` names it), how
  many attempts were made and when the next one is due (Unix time). A line is committed before
  ``queued`` is printed, and an attempt is counted before it is sent, so after a ``kill -9``
  every line not answered is sent again, under a new envelope ``messageId``.
- ``history``: every message sent or received, with its envelope ``messageId`` and content.

Writes are synchronous on the caller's thread and each commit is fsynced (``synchronous=FULL``
in WAL mode): a chat writes a few rows per message at the pace people type, and the queue
promises to survive a power cut, not only a killed process. The file is created readable by its
owner only: it holds the conversation.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from schemas.common import timestamp

__all__ = ["SCHEMA", "ChatStore", "OutboxItem", "Route", "StoreError"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS route (
    chat        TEXT PRIMARY KEY,
    agent       TEXT NOT NULL,               -- clientId from route_assigned, agent:<name>
    assigned_at TEXT NOT NULL,
    configured  INTEGER NOT NULL DEFAULT 0   -- 1 once the agent took configure {talkto}
);
CREATE TABLE IF NOT EXISTS outbox (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT NOT NULL UNIQUE,        -- tg_message content id, the same on every attempt
    text        TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'answered')),
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_at     REAL NOT NULL,               -- Unix time the next attempt is due
    queued_at   TEXT NOT NULL,
    answered_at TEXT
);
CREATE INDEX IF NOT EXISTS outbox_open ON outbox (state, seq);
CREATE TABLE IF NOT EXISTS history (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    ts           TEXT NOT NULL,
    direction    TEXT NOT NULL CHECK (direction IN ('in', 'out')),
    type         TEXT NOT NULL,
    message_id   TEXT,                       -- the envelope's messageId
    peer         TEXT,                       -- out: the topic; in: the sender
    content_json TEXT NOT NULL
);
"""

State = Literal["pending", "delivered", "answered"]


class StoreError(ValueError):
    """The file cannot serve this chat: not SQLite, or made for another chat."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where this chat's messages go."""

    agent: str
    """The agent's clientId."""
    configured: bool
    """Whether the agent has taken ``configure {talkto}`` since the route was assigned."""


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """One line of the conversation waiting for its reply."""

    seq: int
    id: str
    text: str
    state: State
    attempts: int
    next_at: float


class ChatStore:
    """The chat's SQLite file. Open it with :meth:`open`; close it with :meth:`close`."""

    def __init__(self, db: sqlite3.Connection, chat: str) -> None:
        self._db = db
        self.chat = chat

    @classmethod
    def open(cls, path: str | os.PathLike[str], chat: str) -> ChatStore:
        """Open (or create) the file for ``chat``.

        Raises:
            StoreError: the file is not a chat database, or belongs to another chat.
            OSError: the file cannot be created or opened.
        """
        path = Path(path)
        if path.is_dir():
            raise StoreError(f"--db {path} is a directory: give a file name, e.g. chat.db")
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        db = sqlite3.connect(path)
        try:
            db.execute("PRAGMA busy_timeout=5000")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(SCHEMA)
            with db:
                db.execute("INSERT OR IGNORE INTO meta VALUES ('chat', ?)", (chat,))
            (owner,) = db.execute("SELECT value FROM meta WHERE key = 'chat'").fetchone()
        except sqlite3.DatabaseError as exc:
            db.close()
            raise StoreError(f"--db {path}: not a chat database ({exc})") from exc
        if owner != chat:
            db.close()
            raise StoreError(f"--db {path} holds the chat {owner}, not {chat}: use another file")
        return cls(db, chat)

    def close(self) -> None:
        """Close the file. Idempotent."""
        self._db.close()

    # The route

    def route(self) -> Route | None:
        """The agent this chat talks to, or None before ``route_assigned``."""
        row = self._db.execute(
            "SELECT agent, configured FROM route WHERE chat = ?", (self.chat,)
        ).fetchone()
        return None if row is None else Route(row[0], bool(row[1]))

    def assign(self, agent: str) -> bool:
        """Route this chat to ``agent``; return whether that changed anything.

        A new agent starts unconfigured; the same agent keeps its state.
        """
        current = self.route()
        if current is not None and current.agent == agent:
            return False
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO route VALUES (?, ?, ?, 0)", (self.chat, agent, timestamp())
            )
        return True

    def set_configured(self, configured: bool) -> None:
        """Record whether the agent has this chat's ``configure``."""
        with self._db:
            self._db.execute(
                "UPDATE route SET configured = ? WHERE chat = ?", (int(configured), self.chat)
            )

    # The retry queue

    def queue(self, text: str, *, now: float | None = None) -> OutboxItem:
        """Add a line to send, due at once; it is on disk when this returns."""
        item_id = uuid.uuid4().hex
        due = time.time() if now is None else now
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO outbox (id, text, state, next_at, queued_at) "
                "VALUES (?, ?, 'pending', ?, ?)",
                (item_id, text, due, timestamp()),
            )
        assert cursor.lastrowid is not None
        return OutboxItem(cursor.lastrowid, item_id, text, "pending", 0, due)

    def next_to_send(self, now: float) -> OutboxItem | None:
        """The line to send next: the oldest not yet taken, or taken but unanswered too long.

        Lines go in order: a later line waits while an earlier one is not taken. The result
        may not be due yet (its ``next_at`` is later than ``now``).
        """
        row = self._db.execute(
            "SELECT seq, id, text, state, attempts, next_at FROM outbox "
            "WHERE state = 'pending' OR (state = 'delivered' AND next_at <= ?) "
            "ORDER BY seq LIMIT 1",
            (now,),
        ).fetchone()
        return None if row is None else OutboxItem(*row)

    def next_due_at(self) -> float | None:
        """When the earliest unanswered line is due (Unix time), or None if none is open."""
        (due,) = self._db.execute(
            "SELECT MIN(next_at) FROM outbox WHERE state != 'answered'"
        ).fetchone()
        return None if due is None else float(due)

    def start_attempt(self, item_id: str) -> int:
        """Count an attempt before it is sent; return its number (1 for the first)."""
        with self._db:
            self._db.execute("UPDATE outbox SET attempts = attempts + 1 WHERE id = ?", (item_id,))
        (attempts,) = self._db.execute(
            "SELECT attempts FROM outbox WHERE id = ?", (item_id,)
        ).fetchone()
        return int(attempts)

    def delivered(self, item_id: str, next_at: float) -> None:
        """The agent took the line; send it again at ``next_at`` if no reply comes first."""
        with self._db:
            self._db.execute(
                "UPDATE outbox SET state = 'delivered', next_at = ? "
                "WHERE id = ? AND state != 'answered'",
                (next_at, item_id),
            )

    def not_delivered(self, item_id: str, next_at: float) -> None:
        """The agent did not take the line; try again at ``next_at``."""
        with self._db:
            self._db.execute(
                "UPDATE outbox SET state = 'pending', next_at = ? "
                "WHERE id = ? AND state != 'answered'",
                (next_at, item_id),
            )

    def answered(self, item_id: str) -> bool:
        """A reply names the line; return True if it was not answered before."""
        with self._db:
            cursor = self._db.execute(
                "UPDATE outbox SET state = 'answered', answered_at = ? "
                "WHERE id = ? AND state != 'answered'",
                (timestamp(), item_id),
            )
        return cursor.rowcount == 1

    def unanswered(self) -> int:
        """How many lines still wait for a reply."""
        (count,) = self._db.execute(
            "SELECT COUNT(*) FROM outbox WHERE state != 'answered'"
        ).fetchone()
        return int(count)

    # History

    def record(
        self,
        direction: Literal["in", "out"],
        message_type: str,
        content: dict[str, Any],
        *,
        message_id: str | None = None,
        peer: str | None = None,
    ) -> None:
        """Add a message sent (``out``) or received (``in``) to the history."""
        with self._db:
            self._db.execute(
                "INSERT INTO history (ts, direction, type, message_id, peer, content_json) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (timestamp(), direction, message_type, message_id, peer, json.dumps(content)),
            )
