"""Tests for bus.activity: batching, ordering, flushing, append-only triggers, fail closed."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bus.activity import COLUMNS, EVENTS, ActivityLog
from bus.errors import AuditUnavailable

TIMEOUT = 5.0  # seconds; generous, every wait here is on an event, never a sleep


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[ActivityLog]:
    activity = ActivityLog(tmp_path / "activity.db", retry_delay=0)
    await activity.open()
    try:
        yield activity
    finally:
        await activity.close()


def read_rows(path: Path) -> list[dict[str, Any]]:
    """All rows of the log through a plain sqlite3 connection, by id."""
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(row) for row in conn.execute("SELECT * FROM activity_log ORDER BY id")]
    conn.close()
    return rows


class FlakyWrites:
    """Replaces a log's _write_batch: fails while ``failing`` is set, else writes for real."""

    def __init__(self, log: ActivityLog) -> None:
        self.real = log._write_batch
        self.failing = True
        self.attempts = 0
        log._write_batch = self  # type: ignore[method-assign]

    async def __call__(self, batch: list[tuple[str | None, ...]]) -> None:
        self.attempts += 1
        if self.failing:
            raise sqlite3.OperationalError("disk I/O error")
        await self.real(batch)


# Writing


async def test_write_stores_every_field(log: ActivityLog) -> None:
    """write() commits one row with each field in its column and the payload as JSON."""
    async with asyncio.timeout(TIMEOUT):
        await log.write(
            "send_start",
            message_id="m1",
            rpc_id=7,
            actor="agent:main",
            topic="bcp:main:researcher",
            status="ok",
            payload={"query_id": "q1", "bits": 6.9},
            error="none",
        )
    [row] = read_rows(log.path)
    assert row["event"] == "send_start"
    assert row["message_id"] == "m1"
    assert row["rpc_id"] == "7"
    assert row["actor"] == "agent:main"
    assert row["topic"] == "bcp:main:researcher"
    assert row["status"] == "ok"
    assert json.loads(row["payload_json"]) == {"query_id": "q1", "bits": 6.9}
    assert row["error"] == "none"


async def test_timestamps_are_utc_microseconds_and_sort_as_text(log: ActivityLog) -> None:
    """ts is fixed-width UTC ISO-8601 with microseconds and 'Z', so text order is time order."""
    for _ in range(50):
        log.record("connect")
    async with asyncio.timeout(TIMEOUT):
        await log.commit()
    stamps = [row["ts"] for row in read_rows(log.path)]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", ts) for ts in stamps)
    assert stamps == sorted(stamps)


@pytest.mark.parametrize(
    "ns",
    [
        [1_700_000_000_000_000_000, 1_700_000_000_999_999_999, 1_700_000_001_000_000_000],
        [1_799_999_999_999_999_000, 1_800_000_000_000_001_000, 1_799_999_999_500_000_000],
        [0, 59_000_000_000, 86_400_123_456_789],
    ],
)
def test_timestamps_match_the_clock_across_seconds(ns: list[int]) -> None:
    """The cached date-and-time prefix is renewed whenever the second changes, either way."""
    from datetime import UTC, datetime

    from bus import activity

    clock = activity._Clock()
    for value in ns:
        seconds, micros = divmod(value // 1000, 1_000_000)
        expected = datetime.fromtimestamp(seconds, UTC).replace(microsecond=micros)
        assert clock.format(value // 1000) == expected.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_timestamps_never_go_backwards(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock stepped back holds the last stamp until it catches up, then follows it again."""
    from bus import activity

    monkeypatch.setattr(activity, "_clock", activity._Clock())
    readings = iter(
        [
            1_800_000_000_500_000_000,
            1_799_999_999_000_000_000,  # stepped back 1.5 s, across a second
            1_800_000_000_400_000_000,  # still behind
            1_800_000_000_600_000_000,  # caught up
        ]
    )
    monkeypatch.setattr(activity.time, "time_ns", lambda: next(readings))
    stamps = [activity._now() for _ in range(4)]
    assert stamps == [
        "2027-01-15T08:00:00.500000Z",
        "2027-01-15T08:00:00.500000Z",
        "2027-01-15T08:00:00.500000Z",
        "2027-01-15T08:00:00.600000Z",
    ]


async def test_rows_keep_time_order_when_the_clock_steps_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows recorded after a backward clock jump are still found by a --since of the row before."""
    from bus import activity

    monkeypatch.setattr(activity, "_clock", activity._Clock())
    now = [1_800_000_000_000_000_000]
    monkeypatch.setattr(activity.time, "time_ns", lambda: now[0])
    async with ActivityLog(tmp_path / "a.db") as log:
        log.record("send_start", message_id="before")
        now[0] -= 3_600 * 10**9  # an hour back
        log.record("send_finish", message_id="after")
        async with asyncio.timeout(TIMEOUT):
            await log.commit()
    first, second = read_rows(log.path)
    assert second["ts"] >= first["ts"]
    with sqlite3.connect(log.path) as conn:
        since = conn.execute("SELECT message_id FROM activity_log WHERE ts >= ?", (first["ts"],))
        assert [row[0] for row in since] == ["before", "after"]
    conn.close()


async def test_payload_json_is_stored_as_given(log: ActivityLog) -> None:
    """A caller that encoded the payload once passes the text; it is stored unchanged."""
    async with asyncio.timeout(TIMEOUT):
        await log.write("send_start", payload_json='{"type":"tg_message"}')
    [row] = read_rows(log.path)
    assert row["payload_json"] == '{"type":"tg_message"}'


async def test_missing_payload_stays_null(log: ActivityLog) -> None:
    """A row recorded without a payload has NULL payload_json, not the text 'null'."""
    async with asyncio.timeout(TIMEOUT):
        await log.write("disconnect")
    assert read_rows(log.path)[0]["payload_json"] is None


async def test_payload_json_cannot_represent_is_kept_as_repr(log: ActivityLog) -> None:
    """A payload JSON can't represent (NaN, a set) is stored as valid JSON text, not dropped."""
    async with asyncio.timeout(TIMEOUT):
        await log.write("rpc_error", payload={"bits": math.nan})
        await log.write("rpc_error", payload={1, 2})
    texts = [json.loads(row["payload_json"]) for row in read_rows(log.path)]
    assert texts == ["{'bits': nan}", "{1, 2}"]


async def test_events_lists_the_documented_names() -> None:
    """EVENTS names the per-message events and the gateway's decisions."""
    required = {"send_start", "process_start", "process_finish", "send_finish", "shutdown"}
    gateway = {"bcp_query_refused", "bcp_bits_charged", "bcp_validation", "bcp_push_refused"}
    assert required | gateway <= EVENTS
    assert COLUMNS[0] == "ts"


# Batching and order


async def test_concurrent_commits_share_transactions(log: ActivityLog) -> None:
    """Many concurrent committers all get their rows on disk in fewer transactions than callers."""
    callers = 500

    async def one(i: int) -> None:
        await log.write("send_start", message_id=f"m{i}")

    async with asyncio.timeout(TIMEOUT):
        await asyncio.gather(*(one(i) for i in range(callers)))
    rows = read_rows(log.path)
    assert {row["message_id"] for row in rows} == {f"m{i}" for i in range(callers)}
    assert log.rows_committed == callers
    assert log.batches_committed < callers


async def test_order_is_preserved_across_batches(tmp_path: Path) -> None:
    """Rows land in record order, split into batches of at most batch_max rows."""
    async with ActivityLog(tmp_path / "a.db", batch_max=7) as log:
        for i in range(1000):
            log.record("process_start", message_id=str(i))
        async with asyncio.timeout(TIMEOUT):
            await log.commit()
        assert log.batches_committed == math.ceil(1000 / 7)
    assert [row["message_id"] for row in read_rows(log.path)] == [str(i) for i in range(1000)]


async def test_commit_with_nothing_pending_returns_at_once(log: ActivityLog) -> None:
    """commit() with every row already on disk returns without a transaction."""
    async with asyncio.timeout(TIMEOUT):
        await log.commit()
    assert log.batches_committed == 0


async def test_cancelled_committer_does_not_disturb_others(log: ActivityLog) -> None:
    """A commit() cancelled while waiting leaves later committers and the rows unaffected."""
    log.record("send_start", message_id="a")
    cancelled = asyncio.create_task(log.commit())
    await asyncio.sleep(0)  # let it start waiting (ordering, not timing)
    cancelled.cancel()
    async with asyncio.timeout(TIMEOUT):
        await log.write("send_finish", message_id="a")
    assert cancelled.cancelled()
    assert [row["event"] for row in read_rows(log.path)] == ["send_start", "send_finish"]


async def test_two_writers_share_one_file(tmp_path: Path) -> None:
    """Two logs on one file (as two processes would be) both get every row in."""
    path = tmp_path / "shared.db"
    async with ActivityLog(path) as first, ActivityLog(path) as second:
        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(
                *(first.write("connect", actor="bus") for _ in range(100)),
                *(second.write("bcp_delivered", actor="system:gateway") for _ in range(100)),
            )
    actors = [row["actor"] for row in read_rows(path)]
    assert actors.count("bus") == actors.count("system:gateway") == 100


async def test_a_held_lock_waits_off_the_loop(log: ActivityLog, tmp_path: Path) -> None:
    """While another process holds the write lock, commit() waits on the database thread: the
    loop keeps running, and the rows land once the lock is released."""
    assert log._db is not None
    thread_path = asyncio.Event()
    real_execute = log._db.execute

    def spy(sql: str, parameters: Any = None) -> Any:
        if sql.startswith("INSERT"):
            thread_path.set()
        return real_execute(sql, parameters)

    log._db.execute = spy  # type: ignore[method-assign]
    other = sqlite3.connect(log.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # the write lock, as another process would hold it
        log.record("send_start", message_id="held")
        committing = asyncio.create_task(log.commit())
        async with asyncio.timeout(TIMEOUT):
            await thread_path.wait()  # the loop ran on while the writer waited for the lock
        assert not committing.done()
        other.execute("COMMIT")
        async with asyncio.timeout(TIMEOUT):
            await committing
    finally:
        other.close()
    assert [row["message_id"] for row in read_rows(log.path)] == ["held"]


async def test_checkpoints_run_every_checkpoint_rows(tmp_path: Path) -> None:
    """The writer never checkpoints inside a commit; every ``checkpoint_rows`` rows a passive
    checkpoint copies the WAL into the database file."""
    path = tmp_path / "activity.db"
    async with ActivityLog(path, checkpoint_rows=500) as log:
        empty = path.stat().st_size
        async with asyncio.timeout(TIMEOUT):
            for batch in range(3):
                for n in range(250):
                    log.record("connect", actor=f"peer-{batch}-{n}")
                await log.commit()
            while log.checkpoints < 1:
                assert log._checkpoint is not None
                await asyncio.wait({log._checkpoint})
        assert log.checkpoints == 1  # 750 rows: one checkpoint at 500
        assert path.stat().st_size > empty
    assert len(read_rows(path)) == 750


# Lifecycle


async def test_close_flushes_recorded_rows(tmp_path: Path) -> None:
    """close() writes every row recorded, even those nobody committed."""
    log = ActivityLog(tmp_path / "a.db")
    await log.open()
    for i in range(10):
        log.record("shutdown", status=str(i))
    async with asyncio.timeout(TIMEOUT):
        await log.close()
    assert [row["status"] for row in read_rows(log.path)] == [str(i) for i in range(10)]


async def test_close_is_idempotent(tmp_path: Path) -> None:
    """close() may be called again, and concurrently; the log reports closed afterwards."""
    log = ActivityLog(tmp_path / "a.db")
    await log.open()
    assert not log.closed
    async with asyncio.timeout(TIMEOUT):
        await asyncio.gather(log.close(), log.close())
        await log.close()
    assert log.closed


async def test_closed_log_refuses_rows(tmp_path: Path) -> None:
    """record() after close() raises AuditUnavailable instead of losing the row."""
    async with ActivityLog(tmp_path / "a.db") as log:
        pass
    with pytest.raises(AuditUnavailable, match="closed"):
        log.record("connect")


async def test_commit_requires_open(tmp_path: Path) -> None:
    """commit() on a log never opened raises RuntimeError, a programming error."""
    log = ActivityLog(tmp_path / "a.db")
    log.record("connect")
    with pytest.raises(RuntimeError, match="open"):
        await log.commit()


async def test_rows_recorded_before_open_are_written(tmp_path: Path) -> None:
    """Rows buffered before open() are written once the writer starts."""
    log = ActivityLog(tmp_path / "a.db")
    log.record("connect")
    async with log:
        async with asyncio.timeout(TIMEOUT):
            await log.commit()
    assert len(read_rows(log.path)) == 1


async def test_open_twice_is_an_error(log: ActivityLog) -> None:
    """A second open() raises RuntimeError rather than starting a second writer."""
    with pytest.raises(RuntimeError, match="already"):
        await log.open()


async def test_open_fails_on_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    """open() on a file that is not SQLite raises sqlite3.DatabaseError."""
    path = tmp_path / "not.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(sqlite3.DatabaseError):
        await ActivityLog(path).open()


# Append-only, enforced by the database


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE activity_log SET event = 'forged' WHERE id = 1",
        "DELETE FROM activity_log WHERE id = 1",
        "INSERT OR REPLACE INTO activity_log (id, ts, event) VALUES (1, 'x', 'forged')",
        "INSERT OR IGNORE INTO activity_log (id, ts, event) VALUES (1, 'x', 'forged')",
        "INSERT INTO activity_log (id, ts, event) VALUES (1, 'x', 'forged')"
        " ON CONFLICT(id) DO UPDATE SET event = 'forged'",
    ],
)
async def test_history_cannot_be_changed(log: ActivityLog, sql: str) -> None:
    """UPDATE, DELETE and inserts reusing an id are refused from any sqlite3 connection."""
    async with asyncio.timeout(TIMEOUT):
        await log.write("send_start", message_id="m1")
    conn = sqlite3.connect(log.path)
    try:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            conn.execute(sql)
        conn.rollback()
    finally:
        conn.close()
    [row] = read_rows(log.path)
    assert row["event"] == "send_start"


async def test_new_rows_may_still_be_inserted_by_others(log: ActivityLog) -> None:
    """Another connection may append rows; the triggers only stop rewriting."""
    conn = sqlite3.connect(log.path)
    with conn:
        conn.execute("INSERT INTO activity_log (ts, event) VALUES ('t', 'connect')")
    conn.close()
    async with asyncio.timeout(TIMEOUT):
        await log.write("disconnect")
    assert [row["event"] for row in read_rows(log.path)] == ["connect", "disconnect"]


# Failing closed


async def test_failed_batch_raises_and_is_retried_later(log: ActivityLog) -> None:
    """A batch failing every attempt raises AuditUnavailable; its rows land once the db recovers."""
    flaky = FlakyWrites(log)
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable, match="could not write 1 rows"):
            await log.write("send_start", message_id="m1")
    assert flaky.attempts == log.retries == 3
    assert read_rows(log.path) == []

    flaky.failing = False
    async with asyncio.timeout(TIMEOUT):
        await log.write("send_finish", message_id="m1")
    assert [row["event"] for row in read_rows(log.path)] == ["send_start", "send_finish"]
    assert log.batches_committed == 1  # the kept row went in with the next batch


async def test_commit_alone_retries_kept_rows(log: ActivityLog) -> None:
    """After a failure, commit() with no new rows retries the kept ones."""
    flaky = FlakyWrites(log)
    log.record("bcp_bits_charged")
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable):
            await log.commit()
        flaky.failing = False
        await log.commit()
    assert len(read_rows(log.path)) == 1


async def test_every_waiter_of_a_failed_batch_is_told(log: ActivityLog) -> None:
    """All committers waiting on a failed batch get AuditUnavailable, none hang."""
    flaky = FlakyWrites(log)
    async with asyncio.timeout(TIMEOUT):
        results = await asyncio.gather(
            *(log.write("send_start", message_id=str(i)) for i in range(20)),
            return_exceptions=True,
        )
    assert all(isinstance(result, AuditUnavailable) for result in results)
    flaky.failing = False  # the fixture's close() then flushes the 20 kept rows


async def test_transient_failure_is_absorbed_by_retries(log: ActivityLog) -> None:
    """A batch that fails once and then succeeds commits without an error to the caller."""
    flaky = FlakyWrites(log)
    real = flaky.real

    async def fail_once(batch: list[tuple[str | None, ...]]) -> None:
        flaky.attempts += 1
        if flaky.attempts == 1:
            raise sqlite3.OperationalError("database is locked")
        await real(batch)

    log._write_batch = fail_once  # type: ignore[method-assign]
    async with asyncio.timeout(TIMEOUT):
        await log.write("connect")
    assert flaky.attempts == 2
    assert len(read_rows(log.path)) == 1


async def test_close_reports_rows_it_could_not_write(tmp_path: Path) -> None:
    """close() raises AuditUnavailable if the flush fails; a second close() is quiet."""
    log = ActivityLog(tmp_path / "a.db", retry_delay=0)
    await log.open()
    FlakyWrites(log)
    log.record("shutdown")
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable, match="1 rows unwritten"):
            await log.close()
        await log.close()
    with pytest.raises(AuditUnavailable, match="closed"):
        await log.commit()


async def test_cancelled_writer_fails_waiters(tmp_path: Path) -> None:
    """If the writer task dies, committers get AuditUnavailable instead of waiting forever."""
    log = ActivityLog(tmp_path / "a.db")
    await log.open()
    assert log._writer is not None
    log._writer.cancel()
    log.record("connect")
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable):
            await log.commit()
        with pytest.raises(AuditUnavailable, match="unwritten"):
            await log.close()


async def test_cancelled_committer_of_a_failed_batch_is_skipped(log: ActivityLog) -> None:
    """A committer cancelled while its batch fails is skipped; the others still get the error."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def blocked_failure(batch: list[tuple[str | None, ...]]) -> None:
        entered.set()
        await release.wait()
        raise sqlite3.OperationalError("disk I/O error")

    real = log._write_batch
    log._write_batch = blocked_failure  # type: ignore[method-assign]
    log.record("send_start")
    cancelled = asyncio.create_task(log.commit())
    other = asyncio.create_task(log.commit())
    async with asyncio.timeout(TIMEOUT):
        await entered.wait()
        cancelled.cancel()
        log.retries = 1
        release.set()
        with pytest.raises(AuditUnavailable):
            await other
    assert cancelled.cancelled()
    log._write_batch = real  # type: ignore[method-assign]


async def test_crashed_writer_is_logged_and_fails_waiters(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug that kills the writer is logged; committers and close() get AuditUnavailable."""

    async def broken_drain() -> None:
        raise RuntimeError("bug")

    log = ActivityLog(tmp_path / "a.db")
    log._drain = broken_drain  # type: ignore[method-assign]
    await log.open()
    log.record("connect")
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable):
            await log.commit()
        with pytest.raises(AuditUnavailable, match="unwritten"):
            await log.close()
    assert "writer crashed" in caplog.text


async def test_close_without_open(tmp_path: Path) -> None:
    """close() on a log never opened just marks it closed."""
    log = ActivityLog(tmp_path / "a.db")
    await log.close()
    assert log.closed


async def test_backlog_limit_fails_closed(tmp_path: Path) -> None:
    """Past queue_max buffered rows, record() raises AuditUnavailable; commit() makes room."""
    async with ActivityLog(tmp_path / "a.db", queue_max=3) as log:
        for _ in range(3):
            log.record("connect")
        with pytest.raises(AuditUnavailable, match="backlog is full"):
            log.record("connect")
        async with asyncio.timeout(TIMEOUT):
            await log.commit()
        log.record("connect")
    assert len(read_rows(log.path)) == 4
