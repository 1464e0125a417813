"""The gateway's changes without a restart: its channels and the operators' budget resets.

:class:`GatewayChannels` is the gateway's part of a :class:`bus.ops.reload.Reloader`: when the
agent definitions change (or on SIGHUP) it builds the channels again and, if the bus's part
accepts its files too, puts them in force together (see :meth:`Gateway.use_channels`).

:class:`BudgetResets` reads the ``bcp_budget_reset`` rows that ``bcpbus budget reset`` writes
into the activity log and starts the channel's new budget session at once. It reads only the
rows after the last one it saw (``id > ?``, a range of the table's primary key), once a second
and on SIGHUP, on a connection of its own in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

from schemas.agents import build_channels, load_agents

from .gateway import Gateway
from .state import ChannelKey

__all__ = ["BudgetResets", "GatewayChannels", "last_row_id"]


class GatewayChannels:
    """Reload the gateway's channels from ``agents_dir``."""

    name = "gateway"

    def __init__(self, gateway: Gateway, agents_dir: Path) -> None:
        self.gateway = gateway
        self.agents_dir = agents_dir

    def watched(self) -> list[Path]:
        return [self.agents_dir]

    def prepare(self) -> Callable[[], str]:
        """Build the channels; raises DefinitionError naming the file and field if they are
        inconsistent."""
        channels = build_channels(load_agents(self.agents_dir))

        def apply() -> str:
            self.gateway.use_channels(channels)
            return f"{len(channels)} channel{'' if len(channels) == 1 else 's'}"

        return apply


class BudgetResets:
    """Apply the ``bcp_budget_reset`` rows written after ``after`` to ``gateway``.

    Args:
        after: the highest row id already accounted for (:func:`last_row_id` before the
            gateway restored its state from the log).
        say: prints one line per reset applied.
    """

    def __init__(
        self,
        gateway: Gateway,
        db: Path,
        after: int,
        *,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.db = db
        self.after = after
        self.say = say

    async def __call__(self) -> None:
        rows, last = await asyncio.to_thread(_resets_after, self.db, self.after)
        self.after = max(self.after, last)
        for topic in rows:
            key = _channel(topic)
            if key is None or key not in self.gateway.channels:
                continue
            self.gateway.reset_budget(key)
            if self.say is not None:
                self.say(f"bcpbus: budget reset: {topic} starts a new budget session")


def last_row_id(db: Path) -> int:
    """The highest row id of the activity log at ``db``; 0 for an empty or missing log."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        try:
            row = conn.execute("SELECT MAX(id) FROM activity_log").fetchone()
        except sqlite3.OperationalError:  # no table yet
            return 0
    return int(row[0] or 0)


def _resets_after(db: Path, after: int) -> tuple[list[str], int]:
    """The topics of the reset rows after ``after``, and the last row id read up to."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        conn.execute("PRAGMA busy_timeout = 5000")
        # Up to a fixed id, so that each row is read once even while rows are added.
        last = int(conn.execute("SELECT MAX(id) FROM activity_log").fetchone()[0] or 0)
        rows = conn.execute(
            "SELECT topic FROM activity_log WHERE id > ? AND id <= ? "
            "AND event = 'bcp_budget_reset' ORDER BY id",
            (after, last),
        ).fetchall()
    return [str(topic) for (topic,) in rows], last


def _channel(topic: str) -> ChannelKey | None:
    parts = topic.split(":")
    if len(parts) != 3 or parts[0] != "bcp":
        return None
    return parts[1], parts[2]
