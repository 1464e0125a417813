"""Scenario 6: the activity log alone: rows/s its writer commits, and what group commit adds.

One worker process opens an :class:`~bus.log.activity.ActivityLog` on a fresh file and runs three
loads, the way the bus uses it:

- ``bulk``: record 50,000 rows, then one ``commit()``; rows/s is the writer's ceiling.
- ``requests xC``: ``C`` concurrent callers, each in a loop: record the four rows of one
  ``sendMessage`` (``send_start``, ``process_start``, ``process_finish``, ``send_finish``) and
  ``await commit()``. Rows/s, requests/s, the ``commit()`` wait (p50, p99) and rows per
  transaction. With one caller the wait is one transaction's latency; with 64 it shows how long
  a caller waits for the batch it joins.

CPU per row is the process's (the event loop and the SQLite thread together).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bus.core.logevents import LogEvent
from bus.log.activity import ActivityLog

from .common import emit, percentile, spawn_worker, spread, summarize, table

__all__ = ["Options", "options", "report", "run", "writer"]


@dataclass(frozen=True)
class Options:
    """Repetitions, bulk rows, requests per load, concurrent callers per load."""

    reps: int = 5
    bulk_rows: int = 50_000
    requests: int = 20_000
    callers: tuple[int, ...] = (1, 64)
    loop: str = "asyncio"


def options(quick: bool, loop: str) -> Options:
    """The full run, or a tiny one that only checks that everything starts and finishes."""
    if quick:
        return Options(reps=1, bulk_rows=2_000, requests=400, loop=loop)
    return Options(loop=loop)


def _send_rows(log: ActivityLog, n: int) -> None:
    message_id, topic = f"m-{n}", "agent:bench"
    log.record(
        LogEvent.SEND_START,
        message_id=message_id,
        rpc_id=n,
        actor="tg:bench",
        topic=topic,
        payload={"type": "tg_message"},
    )
    log.record(LogEvent.PROCESS_START, message_id=message_id, actor="agent:bench", topic=topic)
    log.record(
        LogEvent.PROCESS_FINISH,
        message_id=message_id,
        actor="agent:bench",
        topic=topic,
        status="processed",
    )
    log.record(
        LogEvent.SEND_FINISH,
        message_id=message_id,
        rpc_id=n,
        actor="tg:bench",
        topic=topic,
        status="delivered 1/1",
    )


async def _bulk(log: ActivityLog, rows: int) -> dict[str, float]:
    cpu, start = time.process_time(), time.perf_counter()
    for n in range(rows // 4):
        _send_rows(log, n)
    await log.commit()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"rows_per_s": rows / elapsed, "cpu_us_per_row": cpu / rows * 1e6}


async def _requests(log: ActivityLog, requests: int, callers: int) -> dict[str, float]:
    waits: list[float] = []
    left = requests

    async def caller() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            _send_rows(log, left)
            start = time.perf_counter()
            await log.commit()
            waits.append(time.perf_counter() - start)

    rows0, batches0 = log.rows_committed, log.batches_committed
    cpu, start = time.process_time(), time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(callers):
            group.create_task(caller())
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    rows = log.rows_committed - rows0
    return {
        "rows_per_s": rows / elapsed,
        "requests_per_s": requests / elapsed,
        "commit_p50_ms": percentile(waits, 50) * 1e3,
        "commit_p99_ms": percentile(waits, 99) * 1e3,
        "rows_per_transaction": rows / max(1, log.batches_committed - batches0),
        "cpu_us_per_row": cpu / rows * 1e6,
    }


async def writer(params: dict[str, Any]) -> None:
    """Run the loads on a log at ``params["path"]``; report ``done`` with their figures."""
    emit("ready")
    figures: dict[str, dict[str, float]] = {}
    async with ActivityLog(params["path"]) as log:
        figures["bulk"] = await _bulk(log, params["bulk_rows"])
        for callers in params["callers"]:
            figures[f"requests x{callers}"] = await _requests(log, params["requests"], callers)
    emit("done", figures=figures)


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 6; return the samples and their summary."""
    samples: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-log-") as tmp:
        for rep in range(options.reps):
            directory = Path(tmp) / f"rep-{rep}"
            directory.mkdir()
            params = {**asdict(options), "path": str(directory / "activity.db")}
            worker = await spawn_worker("log", "log", params, directory)
            samples.append((await worker.expect("done"))["figures"])
            await worker.stop()
            brief = ", ".join(f"{k} {v['rows_per_s']:,.0f} rows/s" for k, v in samples[-1].items())
            print(f"  rep {rep + 1}/{options.reps}: {brief}", flush=True)
    summary = {
        load: {key: summarize(s[load][key] for s in samples) for key in samples[0][load]}
        for load in samples[0]
    }
    return {"options": asdict(options), "samples": samples, "summary": summary}


_COLUMNS = {
    "rows/s": "rows_per_s",
    "requests/s": "requests_per_s",
    "commit p50 ms": "commit_p50_ms",
    "commit p99 ms": "commit_p99_ms",
    "rows/txn": "rows_per_transaction",
    "CPU us/row": "cpu_us_per_row",
}


def report(result: Mapping[str, Any]) -> str:
    """The results as a Markdown table; ``-`` where a load has no such figure."""
    rows = [
        [load, *(spread(f[key]) if key in f else "-" for key in _COLUMNS.values())]
        for load, f in result["summary"].items()
    ]
    return table(["load", *_COLUMNS], rows)
