"""Scenario 11: reading messages back by epoch (``fetchMessages``) from a long activity log.

One process writes ``messages`` accepted messages to a fresh log (their four rows each, as the
bus writes them: 50 topics ``agent:t<n>``, one message in 1,000 on ``agent:rare:x``), then opens
a bus on it, without listening, and times :meth:`bus.server.Bus.fetch` from the middle of the
log:

- ``exact``: pages of ``page`` messages on one topic (``agent:t7``, through the topic index);
- ``pattern``: pages on ``agent:*`` (through the epoch index, every row matching);
- ``rare``: one call on ``agent:rare:*``, which matches one row in 1,000, so the call stops at
  its row budget with ``more: true``;
- ``drain``: the second half of the log through ``agent:*``, page after page, in messages/s.

While the pages are read, a task measures how late the event loop wakes up for a 1 ms sleep
(``loop lag``): the reads run on the log's read thread, so only the GIL is shared.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bus.core.epochs import Epochs
from bus.core.logevents import LogEvent
from bus.core.policy import Grants, Policy
from bus.log.activity import ActivityLog
from bus.ops.credentials import Credentials
from bus.server import Bus

from .common import percentile, spread, summarize, table

__all__ = ["Options", "options", "report", "run"]

_TOPICS = 50
_READER = Grants("bench:reader", subscribe_patterns=("agent:*",))


@dataclass(frozen=True)
class Options:
    """Repetitions, messages in the log, messages per page, pages timed per load."""

    reps: int = 3
    messages: int = 200_000
    page: int = 1_000
    pages: int = 7
    loop: str = "asyncio"


def options(quick: bool, loop: str) -> Options:
    """The full run, or a tiny one that only checks that everything starts and finishes."""
    if quick:
        return Options(reps=1, messages=2_000, page=100, pages=2, loop=loop)
    return Options(loop=loop)


async def _fill(path: Path, messages: int) -> None:
    epochs = Epochs()
    async with ActivityLog(path) as log:
        for n in range(messages):
            topic = f"agent:t{n % _TOPICS}" if n % 1000 else "agent:rare:x"
            envelope = {
                "messageId": f"m{n}",
                "type": "tg_message",
                "from": "tg:bench",
                "timestamp": "2026-11-21T20:22:35Z",
                "content": {"text": "x" * 150, "n": n},
            }
            epoch, common = epochs.next(), {"message_id": f"m{n}", "topic": topic}
            log.record(
                LogEvent.SEND_START,
                actor="tg:bench",
                status="taint:none",
                payload_json=json.dumps(envelope),
                epoch=epoch,
                **common,
            )
            log.record(LogEvent.PROCESS_START, actor="agent:bench", epoch=epoch, **common)
            log.record(
                LogEvent.PROCESS_FINISH,
                actor="agent:bench",
                status="processed",
                epoch=epoch,
                **common,
            )
            log.record(
                LogEvent.SEND_FINISH,
                actor="tg:bench",
                status="delivered 1/1",
                epoch=epoch,
                **common,
            )
            if n % 5000 == 4999:
                await log.commit()


async def _pages(bus: Bus, pattern: str, since: int, options: Options) -> float:
    """Median milliseconds of one page from ``since``."""
    times = []
    for _ in range(options.pages):
        start = time.perf_counter()
        await bus.fetch(_READER, pattern, since, options.page)
        times.append((time.perf_counter() - start) * 1e3)
    return percentile(times, 50)


async def _drain(bus: Bus, since: int, options: Options) -> float:
    """Messages per second reading everything after ``since`` on ``agent:*``."""
    count, more, start = 0, True, time.perf_counter()
    while more:
        page = await bus.fetch(_READER, "agent:*", since, options.page)
        count, since, more = count + len(page.messages), page.next_epoch, page.more
    return count / (time.perf_counter() - start)


async def _measure(path: Path, options: Options) -> dict[str, float]:
    lags: list[float] = []
    stop = asyncio.Event()

    async def probe() -> None:
        while not stop.is_set():
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append((time.perf_counter() - start - 0.001) * 1e3)

    async with ActivityLog(path) as log:
        bus = Bus(policy=Policy.default(), credentials=Credentials.empty(), log=log)
        first = (await bus.fetch(_READER, "agent:*", 0, 1)).messages[0].epoch
        middle = first + (bus.latest_epoch - first) // 2
        task = asyncio.create_task(probe())
        figures = {
            "exact_ms": await _pages(bus, "agent:t7", middle, options),
            "pattern_ms": await _pages(bus, "agent:*", middle, options),
            "rare_ms": await _pages(bus, "agent:rare:*", middle, options),
            "drain_msgs_per_s": await _drain(bus, middle, options),
        }
        stop.set()
        await task
        await bus.close()
    figures["lag_p99_ms"] = percentile(lags, 99)
    return figures


async def run(options: Options) -> dict[str, Any]:
    """Run scenario 11; return the samples and their summary."""
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-fetch-") as tmp:
        path = Path(tmp) / "activity.db"
        start = time.perf_counter()
        await _fill(path, options.messages)
        print(f"  wrote {options.messages:,} messages in {time.perf_counter() - start:.1f} s")
        for rep in range(options.reps):
            samples.append(await _measure(path, options))
            print(
                f"  rep {rep + 1}/{options.reps}: "
                + ", ".join(f"{k} {v:,.1f}" for k, v in samples[-1].items()),
                flush=True,
            )
    summary = {key: summarize(s[key] for s in samples) for key in samples[0]}
    return {"options": asdict(options), "samples": samples, "summary": summary}


_COLUMNS = {
    "page, one topic (ms)": "exact_ms",
    "page, pattern (ms)": "pattern_ms",
    "rare pattern, one call (ms)": "rare_ms",
    "drain (msgs/s)": "drain_msgs_per_s",
    "loop lag p99 (ms)": "lag_p99_ms",
}


def report(result: Mapping[str, Any]) -> str:
    """The results as a Markdown table."""
    summary = result["summary"]
    messages, page = result["options"]["messages"], result["options"]["page"]
    return table(
        ["log", "page", *_COLUMNS],
        [[f"{messages:,} messages", str(page), *(spread(summary[k]) for k in _COLUMNS.values())]],
    )
