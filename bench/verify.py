"""Scenario 8: ``bcpbus audit verify`` over a large activity log (target: 1,000,000 rows in 30 s).

The orchestrator builds the log with :class:`~bus.log.activity.ActivityLog` itself, the way the bus
writes it: one ``sendMessage``'s four rows at a time (``send_start`` with a 200-byte envelope,
``process_start``, ``process_finish``, ``send_finish``), committed in batches of 1,000 rows, so
every row is chained by the writer. Then it runs ``python -m peers audit verify`` on the file as
a child process, ``reps`` times, and reads its wall time and CPU time; the command must exit 0.

Figures: rows verified, seconds, rows/s, CPU seconds of the verify process; and the rows/s the
writer built the log at (chain included).
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bus.core.logevents import LogEvent
from bus.log.activity import ActivityLog

from .common import spread, summarize, table

__all__ = ["Options", "options", "report", "run"]

ENVELOPE = json.dumps(
    {
        "messageId": "m-0",
        "type": "tg_message",
        "from": "tg:bench",
        "topic": "agent:bench",
        "timestamp": "2026-05-09T07:35:25.123Z",
        "content": {"text": "x" * 200},
    },
    separators=(",", ":"),
)


@dataclass(frozen=True)
class Options:
    """Rows in the log, verify runs over it."""

    reps: int = 3
    rows: int = 1_000_000
    loop: str = "asyncio"


def options(quick: bool, loop: str) -> Options:
    """The full run, or a tiny one that only checks that everything starts and finishes."""
    return Options(reps=1, rows=4_000, loop=loop) if quick else Options(loop=loop)


async def build(path: Path, rows: int) -> float:
    """Write ``rows`` rows (a multiple of four) to a new log at ``path``; return rows/s."""
    started = time.perf_counter()
    async with ActivityLog(path, batch_max=1000) as log:
        for n in range(rows // 4):
            message_id = f"m-{n}"
            common = {"message_id": message_id, "topic": "agent:bench"}
            log.record(
                LogEvent.SEND_START, **common, rpc_id=n, actor="tg:bench", payload_json=ENVELOPE
            )
            log.record(LogEvent.PROCESS_START, **common, actor="agent:bench")
            log.record(LogEvent.PROCESS_FINISH, **common, actor="agent:bench", status="processed")
            log.record(
                LogEvent.SEND_FINISH, **common, rpc_id=n, actor="tg:bench", status="delivered 1/1"
            )
            if n % 250 == 249:
                await log.commit()
    return rows / (time.perf_counter() - started)


async def _verify(path: Path) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "peers",
        "audit",
        "verify",
        "--db",
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise RuntimeError(f"verify failed ({process.returncode}): {out!r} {err!r}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"seconds": seconds, "cpu_s": cpu}


async def run(options: Options) -> dict[str, Any]:
    """Build the log once, verify it ``reps`` times; return the samples and their summary."""
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        path = Path(tmp) / "activity.db"
        rows = options.rows - options.rows % 4
        written = await build(path, rows)
        total = rows + 1  # the chain_start row
        print(f"  built {total:,} rows at {written:,.0f} rows/s", flush=True)
        samples = []
        for rep in range(options.reps):
            figures = await _verify(path)
            figures["rows_per_s"] = total / figures["seconds"]
            samples.append(figures)
            print(f"  rep {rep + 1}/{options.reps}: {figures['seconds']:.1f} s", flush=True)
    keys = ("seconds", "rows_per_s", "cpu_s")
    return {
        "options": asdict(options),
        "rows": total,
        "write_rows_per_s": written,
        "samples": samples,
        "summary": {key: summarize(s[key] for s in samples) for key in keys},
    }


def report(result: Mapping[str, Any]) -> str:
    """The results as a Markdown table."""
    summary = result["summary"]
    return table(
        ["rows", "verify s", "rows/s", "verify CPU s", "built at rows/s"],
        [
            [
                result["rows"],
                spread(summary["seconds"]),
                spread(summary["rows_per_s"]),
                spread(summary["cpu_s"]),
                round(result["write_rows_per_s"]),
            ]
        ],
    )
