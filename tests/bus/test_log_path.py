"""The send path's guarantees on the log's real write path: the database thread, real files."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from bus.core.errors import AuditUnavailable
from bus.core.logevents import LogEvent
from bus.log import audit
from bus.log.activity import ActivityLog
from bus.log.rows import LogRow
from peers.testing import Inbox, running_bus, scaled

ROOT = str(Path(__file__).resolve().parents[2])


class HeldInserts:
    """Replaces a log's ``_insert`` (database thread): a batch holding a row for which
    ``holds(row)`` is true tells the loop (``entered``) and waits for ``release``, or fails
    with ``fail`` if it is set."""

    def __init__(self, log: ActivityLog, holds: Callable[[LogRow], bool]) -> None:
        self.real = log._store.insert
        self.holds = holds
        self.loop = asyncio.get_running_loop()
        self.entered = asyncio.Event()
        self.release = threading.Event()
        self.fail: Exception | None = None
        log._store.insert = self  # type: ignore[method-assign]

    def __call__(self, batch: list[LogRow]) -> None:
        if any(self.holds(row) for row in batch):
            self.loop.call_soon_threadsafe(self.entered.set)
            if self.fail is not None:
                raise self.fail
            if not self.release.wait(scaled(5)):
                raise TimeoutError("the test never released the INSERT")
        self.real(batch)


def event_is(name: str, message_id: str | None = None) -> Callable[[LogRow], bool]:
    """Whether a row is a ``name`` row (of ``message_id``, if given)."""
    return lambda row: row.event == name and message_id in (None, row.message_id)


async def test_nothing_is_delivered_when_send_start_cannot_be_written(tmp_path: Path) -> None:
    """A disk that refuses the batch holding send_start: the sender gets -32006 and the
    subscriber nothing; the message is delivered once the disk is back and it is sent again."""
    async with running_bus(tmp_path) as h:
        h.log.retry_delay = 0
        inserts = HeldInserts(h.log, event_is("send_start", "m-1"))
        inserts.fail = sqlite3.OperationalError("disk I/O error")
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:1") as tg:
            agent.handle(None, inbox)
            await agent.subscribe("agent:w1")
            with pytest.raises(AuditUnavailable):
                await tg.send("agent:w1", "tg_message", {"n": 1}, message_id="m-1")
            await tg.ping()  # a round trip after the refusal: a delivery would have come first
            assert inbox.empty()
            inserts.fail = None
            inserts.release.set()
            result = await tg.send("agent:w1", "tg_message", {"n": 1}, message_id="m-1")
            assert result.delivered_to == 1
            assert (await inbox.get()).content == {"n": 1}
        events = [row["event"] for row in h.rows(message_id="m-1")]
        # The rows of the refused attempt stayed buffered and went in with the next batch.
        assert events.count("send_aborted") == 1 and events[-1] == "send_finish"


async def test_delivery_waits_for_send_start_and_the_answer_for_the_rest(tmp_path: Path) -> None:
    """send_start is on disk before the subscriber gets the message; the sender's answer waits
    until the batch holding send_finish is committed."""
    async with running_bus(tmp_path) as h:
        inserts = HeldInserts(h.log, event_is("send_finish", "m-1"))
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:1") as tg:
            agent.handle(None, inbox)
            await agent.subscribe("agent:w1")
            sending = asyncio.create_task(
                tg.send("agent:w1", "tg_message", {"n": 1}, message_id="m-1")
            )
            await inbox.get()  # delivered ...
            committed = [row["event"] for row in h.rows(message_id="m-1")]
            assert committed == ["send_start", "process_start"]  # ... after its first rows
            async with asyncio.timeout(scaled(5)):
                await inserts.entered.wait()  # the rest is on its way to the disk, held there
            await tg.ping()  # answered on the same connection, after anything sent before it
            assert not sending.done()
            inserts.release.set()
            async with asyncio.timeout(scaled(5)):
                result = await sending
            assert result.delivered_to == 1
            events = [row["event"] for row in h.rows(message_id="m-1")]
            assert events == ["send_start", "process_start", "process_finish", "send_finish"]


async def test_commits_of_many_callers_share_transactions(tmp_path: Path) -> None:
    """64 callers committing while a batch is on the thread go in one transaction after it."""
    async with ActivityLog(tmp_path / "a.db") as log:
        inserts = HeldInserts(log, event_is(LogEvent.CONNECT))
        log.record(LogEvent.CONNECT)
        first = asyncio.create_task(log.commit())
        async with asyncio.timeout(scaled(5)):
            await inserts.entered.wait()
        before = log.batches_committed

        async def caller(n: int) -> None:
            log.record(LogEvent.SEND_START, message_id=f"m-{n}")
            await log.commit()

        callers = [asyncio.create_task(caller(n)) for n in range(64)]
        inserts.release.set()
        async with asyncio.timeout(scaled(5)):
            await asyncio.gather(first, *callers)
        assert log.batches_committed - before == 2  # the held one, then all 64 together
        assert log.rows_committed == 65


# A writer killed mid-stream, then reopened

_WRITER = """
import asyncio, sys
from bus.core.logevents import LogEvent
from bus.log.activity import ActivityLog

async def main():
    async with ActivityLog(sys.argv[1]) as log:
        n = 0
        while True:
            for _ in range(int(sys.argv[2])):
                log.record(LogEvent.SEND_START, message_id=f"m-{n}", payload={"n": n})
                n += 1
            await log.commit()
            print(n, flush=True)

asyncio.run(main())
"""


async def test_a_writer_killed_mid_stream_leaves_a_chain_that_reopens_and_verifies(
    tmp_path: Path,
) -> None:
    """SIGKILL while batches are being committed: every row reported committed is there, the
    log reopens (its tail checked) and goes on, and the whole chain verifies."""
    db = tmp_path / "a.db"
    env = {**os.environ, "PYTHONPATH": ROOT}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WRITER, str(db), "7", stdout=subprocess.PIPE, env=env
    )
    try:
        assert child.stdout is not None
        reported = 0
        while reported < 700:  # a hundred commits, then kill it wherever it is
            async with asyncio.timeout(scaled(10)):
                line = await child.stdout.readline()
            assert line, "the writer ended before it was killed"
            reported = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    async with ActivityLog(db) as log:  # raises ChainBroken if the tail does not verify
        await log.write(LogEvent.CONNECT, actor="after the crash")
    result = audit.verify(db)
    assert result.ok, result.problems
    with sqlite3.connect(db) as conn:
        [(sends,)] = conn.execute("SELECT COUNT(*) FROM activity_log WHERE event = 'send_start'")
    conn.close()
    assert sends >= reported
