"""Bits per channel over time, for the console's audit page: read from the log, drawn as SVG.

:func:`bits_history` reads the gateway's ``bcp_bits_charged``, ``bcp_delivered`` and
``bcp_budget_reset`` rows and adds them up per channel, as ``bcpbus audit --bits`` does
(:func:`bus.log.audit.bits_per_channel`), but keeps every step. :func:`draw` turns one channel's
steps into the geometry of a chart (pure: no I/O, no markup) that the page's template writes
as inline SVG: one step line each for bits charged, refunded and delivered, and the budget as a
dashed line. Nothing is fetched by the browser and no script draws it, so the page keeps its
strict Content-Security-Policy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bus.log.audit import read_only

__all__ = ["Chart", "History", "Line", "Step", "bits_history", "draw"]

_KINDS = ("charged", "refunded", "delivered")


@dataclass(frozen=True)
class Step:
    """The running totals of one channel after one row of the log."""

    ts: str
    charged: float
    refunded: float
    delivered: float
    budget_bits: float | None
    budget_left: float | None


@dataclass
class History:
    """One channel's steps, oldest first."""

    channel: str
    steps: list[Step] = field(default_factory=list)

    @property
    def last(self) -> Step:
        """The totals now."""
        return self.steps[-1]


@dataclass(frozen=True)
class Line:
    """One series of a chart: its name and its SVG ``points``."""

    name: str
    points: str


@dataclass(frozen=True)
class Chart:
    """What an SVG chart of one channel holds, in its own coordinates."""

    width: int
    height: int
    lines: tuple[Line, ...]
    top: float
    """The value at the top of the plot."""
    budget_y: float | None
    """Where the budget's line is, when it is in range."""
    first_ts: str
    last_ts: str


def bits_history(db: str | os.PathLike[str]) -> list[History]:
    """Every BCP channel's bits over time, by channel name.

    Raises:
        FileNotFoundError: there is no such file.
    """
    sql = """
        SELECT ts, event,
               json_extract(payload_json, '$.channel') AS channel,
               json_extract(payload_json, '$.bits') AS bits,
               json_extract(payload_json, '$.budget_bits') AS budget_bits,
               json_extract(payload_json, '$.budget_left') AS budget_left
        FROM activity_log
        WHERE event IN ('bcp_bits_charged', 'bcp_delivered', 'bcp_budget_reset')
          AND json_valid(payload_json)
        ORDER BY id
    """
    channels: dict[str, History] = {}
    with read_only(db) as conn:
        for row in conn.execute(sql):
            if isinstance(row["channel"], str):
                history = channels.setdefault(row["channel"], History(row["channel"]))
                history.steps.append(_step(history, row))
    return [channels[name] for name in sorted(channels)]


def _step(history: History, row: Any) -> Step:
    before = history.steps[-1] if history.steps else Step("", 0.0, 0.0, 0.0, None, None)
    bits = float(row["bits"]) if isinstance(row["bits"], int | float) else 0.0
    charged, refunded, delivered = before.charged, before.refunded, before.delivered
    budget_bits, budget_left = before.budget_bits, before.budget_left
    if row["event"] == "bcp_delivered":
        delivered += bits
    elif row["event"] == "bcp_budget_reset":
        budget_left = budget_bits
    else:
        if bits >= 0:
            charged += bits
        else:
            refunded -= bits
        budget_bits = _number(row["budget_bits"], budget_bits)
        budget_left = _number(row["budget_left"], budget_left)
    return Step(str(row["ts"]), charged, refunded, delivered, budget_bits, budget_left)


def _number(value: Any, default: float | None) -> float | None:
    return float(value) if isinstance(value, int | float) else default


def draw(history: History, *, width: int = 640, height: int = 220, most: int = 320) -> Chart:
    """The chart of ``history``: cumulative charged, refunded and delivered bits as step lines.

    Time runs left to right, from the first step to the last; at most ``most`` steps are drawn
    (the last of each stretch of the time axis), so a busy channel costs the page no more.
    """
    steps = _thin(history.steps, most)
    times = [_seconds(step.ts) for step in steps]
    start, span = times[0], (times[-1] - times[0]) or 1.0
    budget = steps[-1].budget_bits
    top = max([1.0, *(max(s.charged, s.refunded, s.delivered) for s in steps)])
    if budget is not None and budget <= top * 1.5:
        top = max(top, budget)
    pad = 8.0

    def x(t: float) -> float:
        return round(pad + (t - start) / span * (width - 2 * pad), 1)

    def y(value: float) -> float:
        return round(height - pad - value / top * (height - 2 * pad), 1)

    lines = []
    for kind in _KINDS:
        points: list[str] = []
        previous = 0.0
        for t, step in zip(times, steps, strict=True):
            value = getattr(step, kind)
            points += [f"{x(t)},{y(previous)}", f"{x(t)},{y(value)}"]
            previous = value
        points.append(f"{width - pad},{y(previous)}")
        lines.append(Line(kind, " ".join(points)))
    budget_y = y(budget) if budget is not None and budget <= top else None
    return Chart(width, height, tuple(lines), top, budget_y, steps[0].ts, steps[-1].ts)


def _thin(steps: list[Step], most: int) -> list[Step]:
    """At most ``most`` steps: the last of each of ``most`` equal stretches of time."""
    if len(steps) <= most:
        return steps
    times = [_seconds(step.ts) for step in steps]
    start, span = times[0], (times[-1] - times[0]) or 1.0
    kept: dict[int, Step] = {}
    for t, step in zip(times, steps, strict=True):
        kept[min(most - 1, int((t - start) / span * most))] = step
    return [kept[bucket] for bucket in sorted(kept)]


def _seconds(ts: str) -> float:
    try:
        return datetime.fromisoformat(ts).timestamp()
    except ValueError:
        return 0.0
