"""Tests for bus.log.activity: batching, ordering, flushing, append-only triggers, fail closed."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import sqlite3
import threading
from collections.abc import AsyncIterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest

from bus.core.errors import AuditUnavailable
from bus.core.logevents import LogEvent
from bus.log.activity import ActivityLog
from bus.log.rows import COLUMNS


class _Unnamed(StrEnum):
    """An event name that is not valid Unicode: no LogEvent is one, but the log must still
    store such a row rather than stop."""

    ODD = "send_\udc00"


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
    """The rows of the log after its opening ``chain_start``, through plain sqlite3, by id."""
    with sqlite3.connect(path) as conn:
        conn.row_factory = sqlite3.Row
        query = "SELECT * FROM activity_log WHERE event != 'chain_start' ORDER BY id"
        rows = [dict(row) for row in conn.execute(query)]
    conn.close()
    return rows


class FlakyWrites:
    """Replaces a log's _insert, which every batch runs on the database thread however it was
    started: fails while ``failing`` is set, else writes for real."""

    def __init__(self, log: ActivityLog) -> None:
        self.real = log._store.insert
        self.failing = True
        self.attempts = 0
        log._store.insert = self  # type: ignore[method-assign]

    def __call__(self, batch: list[tuple[str | None, ...]]) -> None:
        self.attempts += 1
        if self.failing:
            raise sqlite3.OperationalError("disk I/O error")
        self.real(batch)


class Inserts:
    """Replaces a log's _insert, which runs on the database thread: reports each INSERT to the
    loop (``entered``, ``batches``) and, if ``blocked``, holds it until ``release`` is set."""

    def __init__(self, log: ActivityLog, *, blocked: bool = False) -> None:
        self.real = log._store.insert
        self.loop = asyncio.get_running_loop()
        self.entered = asyncio.Event()
        self.release = threading.Event()
        if not blocked:
            self.release.set()
        self.batches: list[int] = []
        log._store.insert = self  # type: ignore[method-assign]

    def __call__(self, batch: list[tuple[str | None, ...]]) -> None:
        self.batches.append(len(batch))
        self.loop.call_soon_threadsafe(self.entered.set)
        if not self.release.wait(TIMEOUT):
            raise TimeoutError("the test never released the INSERT")
        self.real(batch)


async def ping_pong(rounds: int) -> None:
    """Pass a token between two tasks ``rounds`` times: it only finishes if the loop runs."""
    ping: asyncio.Queue[int] = asyncio.Queue()
    pong: asyncio.Queue[int] = asyncio.Queue()

    async def echo() -> None:
        for _ in range(rounds):
            await pong.put(await ping.get())

    async with asyncio.TaskGroup() as group:
        group.create_task(echo())
        for n in range(rounds):
            await ping.put(n)
            assert await pong.get() == n


async def idle(log: ActivityLog) -> None:
    """Return once the database thread has finished what it was given (checkpoints included)."""
    assert log._thread is not None
    await log._thread.run(lambda: None)


def wal_size(path: Path) -> int:
    """The size of the database's -wal file, 0 if there is none."""
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


# Writing


async def test_write_stores_every_field(log: ActivityLog) -> None:
    """write() commits one row with each field in its column and the payload as JSON."""
    async with asyncio.timeout(TIMEOUT):
        await log.write(
            LogEvent.SEND_START,
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
        log.record(LogEvent.CONNECT)
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

    from bus.log import rows

    clock = rows.Clock()
    for value in ns:
        seconds, micros = divmod(value // 1000, 1_000_000)
        expected = datetime.fromtimestamp(seconds, UTC).replace(microsecond=micros)
        assert clock.format(value // 1000) == expected.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_timestamps_never_go_backwards(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock stepped back holds the last stamp until it catches up, then follows it again."""
    from bus.log import rows

    monkeypatch.setattr(rows, "_clock", rows.Clock())
    readings = iter(
        [
            1_800_000_000_500_000_000,
            1_799_999_999_000_000_000,  # stepped back 1.5 s, across a second
            1_800_000_000_400_000_000,  # still behind
            1_800_000_000_600_000_000,  # caught up
        ]
    )
    monkeypatch.setattr(rows.time, "time_ns", lambda: next(readings))
    stamps = [rows.stamp() for _ in range(4)]
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
    from bus.log import rows

    monkeypatch.setattr(rows, "_clock", rows.Clock())
    now = [1_800_000_000_000_000_000]
    monkeypatch.setattr(rows.time, "time_ns", lambda: now[0])
    async with ActivityLog(tmp_path / "a.db") as log:
        log.record(LogEvent.SEND_START, message_id="before")
        now[0] -= 3_600 * 10**9  # an hour back
        log.record(LogEvent.SEND_FINISH, message_id="after")
        async with asyncio.timeout(TIMEOUT):
            await log.commit()
    first, second = read_rows(log.path)
    assert second["ts"] >= first["ts"]
    with sqlite3.connect(log.path) as conn:
        query = "SELECT message_id FROM activity_log WHERE ts >= ? AND event != 'chain_start'"
        since = conn.execute(query, (first["ts"],))
        assert [row[0] for row in since] == ["before", "after"]
    conn.close()


async def test_payload_json_is_stored_as_given(log: ActivityLog) -> None:
    """A caller that encoded the payload once passes the text; it is stored unchanged."""
    async with asyncio.timeout(TIMEOUT):
        await log.write(LogEvent.SEND_START, payload_json='{"type":"tg_message"}')
    [row] = read_rows(log.path)
    assert row["payload_json"] == '{"type":"tg_message"}'


async def test_missing_payload_stays_null(log: ActivityLog) -> None:
    """A row recorded without a payload has NULL payload_json, not the text 'null'."""
    async with asyncio.timeout(TIMEOUT):
        await log.write(LogEvent.DISCONNECT)
    assert read_rows(log.path)[0]["payload_json"] is None


async def test_payload_json_cannot_represent_is_kept_as_repr(log: ActivityLog) -> None:
    """A payload JSON can't represent (NaN, a set) is stored as valid JSON text, not dropped."""
    async with asyncio.timeout(TIMEOUT):
        await log.write(LogEvent.RPC_ERROR, payload={"bits": math.nan})
        await log.write(LogEvent.RPC_ERROR, payload={1, 2})
    texts = [json.loads(row["payload_json"]) for row in read_rows(log.path)]
    assert texts == ["{'bits': nan}", "{1, 2}"]


async def test_log_events_name_the_documented_events() -> None:
    """LogEvent names the per-message events, the gateway's decisions, and the two that had
    drifted out of the old list (reload, revoked); each member is its stored text."""
    required = {"send_start", "process_start", "process_finish", "send_finish", "shutdown"}
    gateway = {"bcp_query_refused", "bcp_bits_charged", "bcp_validation", "bcp_push_refused"}
    assert required | gateway | {"reload", "revoked"} <= {event.value for event in LogEvent}
    assert all(event == event.value == str(event) for event in LogEvent)
    assert COLUMNS[0] == "ts"


async def test_an_event_is_stored_as_plain_text(log: ActivityLog) -> None:
    """A LogEvent lands in the event column as the same text a bare name did, typed text."""
    async with asyncio.timeout(TIMEOUT):
        await log.write(LogEvent.SEND_START, message_id="m1")
    with sqlite3.connect(log.path) as conn:
        stored = conn.execute(
            "SELECT event, typeof(event) FROM activity_log WHERE message_id = 'm1'"
        ).fetchall()
    conn.close()
    assert stored == [("send_start", "text")]


# Batching and order


async def test_concurrent_commits_share_transactions(log: ActivityLog) -> None:
    """Many concurrent committers all get their rows on disk in fewer transactions than callers."""
    callers = 500

    async def one(i: int) -> None:
        await log.write(LogEvent.SEND_START, message_id=f"m{i}")

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
            log.record(LogEvent.PROCESS_START, message_id=str(i))
        async with asyncio.timeout(TIMEOUT):
            await log.commit()
        assert log.batches_committed == math.ceil(1000 / 7)
    assert [row["message_id"] for row in read_rows(log.path)] == [str(i) for i in range(1000)]


async def test_inserts_take_few_distinct_sizes(log: ActivityLog) -> None:
    """Whatever the batch sizes, the INSERTs SQLite prepares take few sizes: sqlite3 keeps the
    last 128 statements it ran (about 1.6 KiB a row each), so one per batch size grew the bus's
    memory with every new size the load produced. Each batch is still one transaction."""
    statements: list[str] = []
    assert log._thread is not None and log._store.conn is not None
    await log._thread.run(log._store.conn.set_trace_callback, statements.append)
    for size in range(1, 201):
        for i in range(size):
            log.record(LogEvent.PROCESS_START, message_id=f"{size}-{i}")
        async with asyncio.timeout(TIMEOUT):
            await log.commit()
    await log._thread.run(log._store.conn.set_trace_callback, None)
    inserts = [sql for sql in statements if sql.startswith("INSERT INTO activity_log")]
    assert log.batches_committed == 200  # SQLite traces each row's trigger too: count sizes
    sizes = {sql.count("),(") + 1 for sql in inserts}
    assert len(sizes) <= 27  # 1..8, then 4 per doubling up to 224: not 200
    assert sum(sizes) <= 1500  # rows of all the statements kept; one per size: 20,100
    ids = [row["message_id"] for row in read_rows(log.path)]
    assert ids == [f"{size}-{i}" for size in range(1, 201) for i in range(size)]


def test_statement_rows_keep_three_significant_bits() -> None:
    """Batches of up to 896 rows take 35 statement sizes, each under a quarter too long."""
    from bus.log.schema import statement_rows as _statement_rows

    sizes = set()
    for rows in range(1, 897):
        size = _statement_rows(rows)
        assert rows <= size < max(rows + 1, rows * 1.25)
        assert _statement_rows(size) == size == _statement_rows(size, up=False)
        sizes.add(size)
    assert len(sizes) == 35 and max(sizes) == 896
    assert _statement_rows(1000, up=False) == 896 and _statement_rows(7, up=False) == 7


async def test_commit_with_nothing_pending_returns_at_once(log: ActivityLog) -> None:
    """commit() with every row already on disk returns without a transaction."""
    async with asyncio.timeout(TIMEOUT):
        await log.commit()
    assert log.batches_committed == 0


async def test_cancelled_committer_does_not_disturb_others(log: ActivityLog) -> None:
    """A commit() cancelled while waiting leaves later committers and the rows unaffected."""
    log.record(LogEvent.SEND_START, message_id="a")
    cancelled = asyncio.create_task(log.commit())
    await asyncio.sleep(0)  # let it start waiting (ordering, not timing)
    cancelled.cancel()
    async with asyncio.timeout(TIMEOUT):
        await log.write(LogEvent.SEND_FINISH, message_id="a")
    assert cancelled.cancelled()
    assert [row["event"] for row in read_rows(log.path)] == ["send_start", "send_finish"]


async def test_two_writers_share_one_file(tmp_path: Path) -> None:
    """Two logs on one file (as two processes would be) both get every row in."""
    path = tmp_path / "shared.db"
    async with ActivityLog(path) as first, ActivityLog(path) as second:
        async with asyncio.timeout(TIMEOUT):
            await asyncio.gather(
                *(first.write(LogEvent.CONNECT, actor="bus") for _ in range(100)),
                *(second.write(LogEvent.BCP_DELIVERED, actor="system:gateway") for _ in range(100)),
            )
    actors = [row["actor"] for row in read_rows(path)]
    assert actors.count("bus") == actors.count("system:gateway") == 100


async def test_a_held_lock_waits_off_the_loop(log: ActivityLog) -> None:
    """While another process holds the write lock, commit() waits on the database thread: the
    loop keeps running, and the rows land once the lock is released."""
    inserts = Inserts(log)
    other = sqlite3.connect(log.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # the write lock, as another process would hold it
        log.record(LogEvent.SEND_START, message_id="held")
        committing = asyncio.create_task(log.commit())
        async with asyncio.timeout(TIMEOUT):
            await inserts.entered.wait()  # the INSERT started on the thread...
            await ping_pong(100)  # ...and the loop runs on while it waits for the lock
        assert not committing.done()
        other.execute("COMMIT")
        async with asyncio.timeout(TIMEOUT):
            await committing
    finally:
        other.close()
    assert [row["message_id"] for row in read_rows(log.path)] == ["held"]


async def test_a_stalled_write_does_not_stop_the_loop(log: ActivityLog) -> None:
    """An INSERT stuck on the database thread (a frozen disk) leaves the loop running; commit()
    waits for it and returns once it completes."""
    inserts = Inserts(log, blocked=True)
    log.record(LogEvent.SEND_START, message_id="stalled")
    committing = asyncio.create_task(log.commit())
    try:
        async with asyncio.timeout(TIMEOUT):
            await inserts.entered.wait()
            await ping_pong(100)
            log.record(LogEvent.SEND_FINISH, message_id="stalled")  # buffered meanwhile
        assert not committing.done()
    finally:
        inserts.release.set()
    async with asyncio.timeout(TIMEOUT):
        await committing
        await log.commit()
    assert [row["event"] for row in read_rows(log.path)] == ["send_start", "send_finish"]


async def test_rows_recorded_during_a_write_form_the_next_batch(log: ActivityLog) -> None:
    """Group commit: rows recorded while one batch is on the thread go in one more transaction."""
    inserts = Inserts(log, blocked=True)
    log.record(LogEvent.SEND_START, message_id="first")
    first = asyncio.create_task(log.commit())
    async with asyncio.timeout(TIMEOUT):
        await inserts.entered.wait()
    for i in range(50):
        log.record(LogEvent.SEND_START, message_id=f"m{i}")
    rest = [asyncio.create_task(log.commit()) for _ in range(50)]
    inserts.release.set()
    async with asyncio.timeout(TIMEOUT):
        await asyncio.gather(first, *rest)
    assert inserts.batches == [1, 50]
    assert log.batches_committed == 2


def no_writer_task_batches(log: ActivityLog) -> list[int]:
    """Replace the writer task's way to the thread; return the sizes of the batches it took."""
    real, taken = log._write_batch, []

    async def through_the_task(batch: list[tuple[str | None, ...]]) -> None:
        taken.append(len(batch))
        await real(batch)

    log._write_batch = through_the_task  # type: ignore[method-assign]
    return taken


async def test_a_row_nobody_commits_is_written_after_linger(log: ActivityLog) -> None:
    """A row no caller commits reaches the disk on its own, handed over as a commit would be."""
    inserts = Inserts(log)
    taken = no_writer_task_batches(log)
    log.record(LogEvent.CONNECT, actor="a")
    async with asyncio.timeout(TIMEOUT):
        await inserts.entered.wait()
        await idle(log)
    assert [row["event"] for row in read_rows(log.path)] == ["connect"]
    assert log.rows_committed == 1
    assert taken == []  # not through the writer task


async def test_a_row_nobody_commits_follows_the_batch_on_the_thread(
    log: ActivityLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row nobody commits, recorded while a batch is on the thread, waits for that batch
    (one at a time) and then goes in the next, with no committer to start it."""
    monkeypatch.setattr("bus.log.writer.LINGER", 0)  # the timer fires while the batch is away
    inserts = Inserts(log, blocked=True)
    taken = no_writer_task_batches(log)
    log.record(LogEvent.SEND_START, message_id="m")
    committing = asyncio.create_task(log.commit())
    async with asyncio.timeout(TIMEOUT):
        await inserts.entered.wait()
    inserts.entered.clear()
    log.record(LogEvent.CONNECT, actor="a")
    for _ in range(20):  # loop iterations in which the timer fires and finds the thread busy
        await asyncio.sleep(0)
    assert inserts.batches == [1]
    inserts.release.set()
    async with asyncio.timeout(TIMEOUT):
        await committing
        await inserts.entered.wait()
        await idle(log)
    assert inserts.batches == [1, 1]
    assert [row["event"] for row in read_rows(log.path)] == ["send_start", "connect"]
    assert taken == []


async def test_checkpoints_run_every_checkpoint_rows(tmp_path: Path) -> None:
    """Every ``checkpoint_rows`` rows, after the commit is answered, a checkpoint copies the WAL
    into the database file and truncates it."""
    path = tmp_path / "activity.db"
    async with ActivityLog(path, checkpoint_rows=500) as log:
        empty = path.stat().st_size
        async with asyncio.timeout(TIMEOUT):
            for batch in range(2):
                for n in range(250):
                    log.record(LogEvent.CONNECT, actor=f"peer-{batch}-{n}")
                await log.commit()
            await idle(log)
        assert log.checkpoints == 1  # 500 rows: one checkpoint
        assert wal_size(path) == 0
        assert path.stat().st_size > empty
        async with asyncio.timeout(TIMEOUT):
            await log.write(LogEvent.CONNECT)
            await idle(log)
        assert log.checkpoints == 1
        assert wal_size(path) > 0
    assert len(read_rows(path)) == 501


# Lifecycle


async def test_close_flushes_recorded_rows(tmp_path: Path) -> None:
    """close() writes every row recorded, even those nobody committed."""
    log = ActivityLog(tmp_path / "a.db")
    await log.open()
    for i in range(10):
        log.record(LogEvent.SHUTDOWN, status=str(i))
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
        log.record(LogEvent.CONNECT)


async def test_commit_requires_open(tmp_path: Path) -> None:
    """commit() on a log never opened raises RuntimeError, a programming error."""
    log = ActivityLog(tmp_path / "a.db")
    log.record(LogEvent.CONNECT)
    with pytest.raises(RuntimeError, match="open"):
        await log.commit()


async def test_rows_recorded_before_open_are_written(tmp_path: Path) -> None:
    """Rows buffered before open() are written once the writer starts."""
    log = ActivityLog(tmp_path / "a.db")
    log.record(LogEvent.CONNECT)
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
        await log.write(LogEvent.SEND_START, message_id="m1")
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
        await log.write(LogEvent.DISCONNECT)
    assert [row["event"] for row in read_rows(log.path)] == ["connect", "disconnect"]


# Failing closed


async def test_failed_batch_raises_and_is_retried_later(log: ActivityLog) -> None:
    """A batch failing every attempt raises AuditUnavailable; its rows land once the db recovers."""
    flaky = FlakyWrites(log)
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable, match="could not write 1 rows"):
            await log.write(LogEvent.SEND_START, message_id="m1")
    assert flaky.attempts == log.retries == 3
    assert read_rows(log.path) == []

    flaky.failing = False
    async with asyncio.timeout(TIMEOUT):
        await log.write(LogEvent.SEND_FINISH, message_id="m1")
    assert [row["event"] for row in read_rows(log.path)] == ["send_start", "send_finish"]
    assert log.batches_committed == 1  # the kept row went in with the next batch


async def test_commit_alone_retries_kept_rows(log: ActivityLog) -> None:
    """After a failure, commit() with no new rows retries the kept ones."""
    flaky = FlakyWrites(log)
    log.record(LogEvent.BCP_BITS_CHARGED)
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
            *(log.write(LogEvent.SEND_START, message_id=str(i)) for i in range(20)),
            return_exceptions=True,
        )
    assert all(isinstance(result, AuditUnavailable) for result in results)
    flaky.failing = False  # the fixture's close() then flushes the 20 kept rows


async def test_transient_failure_is_absorbed_by_retries(log: ActivityLog) -> None:
    """A batch that fails once and then succeeds commits without an error to the caller."""
    flaky = FlakyWrites(log)
    real = flaky.real

    def fail_once(batch: list[tuple[str | None, ...]]) -> None:
        flaky.attempts += 1
        if flaky.attempts == 1:
            raise sqlite3.OperationalError("database is locked")
        real(batch)

    log._store.insert = fail_once  # type: ignore[method-assign]
    async with asyncio.timeout(TIMEOUT):
        await log.write(LogEvent.CONNECT)
    assert flaky.attempts == 2
    assert len(read_rows(log.path)) == 1


async def test_close_reports_rows_it_could_not_write(tmp_path: Path) -> None:
    """close() raises AuditUnavailable if the flush fails; a second close() is quiet."""
    log = ActivityLog(tmp_path / "a.db", retry_delay=0)
    await log.open()
    FlakyWrites(log)
    log.record(LogEvent.SHUTDOWN)
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
    await asyncio.wait({log._writer})
    log.record(LogEvent.CONNECT)
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable):
            await log.commit()
        with pytest.raises(AuditUnavailable, match="unwritten"):
            await log.close()


async def test_cancelled_committer_of_a_failed_batch_is_skipped(log: ActivityLog) -> None:
    """A committer cancelled while its batch fails is skipped; the others still get the error."""
    loop, real = asyncio.get_running_loop(), log._store.insert
    entered, release = asyncio.Event(), threading.Event()

    def blocked_failure(batch: list[tuple[str | None, ...]]) -> None:  # on the database thread
        loop.call_soon_threadsafe(entered.set)
        release.wait(TIMEOUT)
        raise sqlite3.OperationalError("disk I/O error")

    log._store.insert = blocked_failure  # type: ignore[method-assign]
    log.record(LogEvent.SEND_START)
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
    log._store.insert = real  # type: ignore[method-assign]


async def test_crashed_writer_is_logged_and_fails_waiters(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug that kills the writer is logged; committers and close() get AuditUnavailable."""

    async def broken_drain() -> None:
        raise RuntimeError("bug")

    log = ActivityLog(tmp_path / "a.db")
    log._drain = broken_drain  # type: ignore[method-assign]
    await log.open()
    FlakyWrites(log)  # commit() hands the batch over itself; its failure is the writer's
    log.record(LogEvent.CONNECT)
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
            log.record(LogEvent.CONNECT)
        with pytest.raises(AuditUnavailable, match="backlog is full"):
            log.record(LogEvent.CONNECT)
        async with asyncio.timeout(TIMEOUT):
            await log.commit()
        log.record(LogEvent.CONNECT)
    assert len(read_rows(log.path)) == 4


# Rows SQLite cannot store


async def test_unwritable_rows_are_replaced_and_the_writer_moves_on(log: ActivityLog) -> None:
    """Rows holding text that is not Unicode are stored as row_unwritable; the rows around them
    land in order, the commit succeeds, and later commits work."""
    log.record(LogEvent.SEND_START, message_id="m0")
    log.record(LogEvent.RPC_ERROR, rpc_id="\ud800", actor="anonymous", status="x")
    log.record(LogEvent.SEND_START, message_id="m1", payload={"content": "bad \udc80 text"})
    for i in range(2, 6):
        log.record(LogEvent.SEND_START, message_id=f"m{i}")
    async with asyncio.timeout(TIMEOUT):
        await log.commit()
        await log.write(LogEvent.SEND_FINISH, message_id="m5")
    rows = read_rows(log.path)
    assert [(row["event"], row["message_id"]) for row in rows] == [
        ("send_start", "m0"),
        ("row_unwritable", None),
        ("row_unwritable", "m1"),
        *(("send_start", f"m{i}") for i in range(2, 6)),
        ("send_finish", "m5"),
    ]
    assert log.rows_unwritable == 2
    assert log.rows_committed == 8
    assert "UnicodeEncodeError" in rows[1]["error"]


async def test_row_unwritable_keeps_what_it_can_and_a_digest(log: ActivityLog) -> None:
    """The replacement keeps the timestamp and the columns that are text, names the others, and
    carries the SHA-256 of the original row as _unwritable documents it."""
    log.record(
        LogEvent.PROCESS_START,
        message_id="m1",
        rpc_id="7",
        actor="agent:\ud83d",
        topic="agent:main",
        status="ok",
        payload_json='{"text":"\udfff"}',
    )
    async with asyncio.timeout(TIMEOUT):
        await log.commit()
    [row] = read_rows(log.path)
    assert row["event"] == "row_unwritable"
    assert (row["message_id"], row["rpc_id"], row["actor"], row["topic"], row["status"]) == (
        "m1",
        "7",
        None,
        "agent:main",
        "ok",
    )
    payload = json.loads(row["payload_json"])
    original = [row["ts"], "process_start", "m1", "7", "agent:\ud83d", "agent:main", "ok"]
    original += ['{"text":"\udfff"}', None, None, None]  # error, epoch, trace_id
    assert payload == {
        "event": "process_start",
        "columns": ["actor", "payload_json"],
        "sha256": hashlib.sha256(json.dumps(original).encode()).hexdigest(),
    }


async def test_an_unwritable_event_name_is_escaped(log: ActivityLog) -> None:
    """An event name that is not Unicode text is named in the payload with escapes."""
    async with asyncio.timeout(TIMEOUT):
        await log.write(_Unnamed.ODD)  # type: ignore[arg-type]  # what record() cannot prevent
    [row] = read_rows(log.path)
    assert json.loads(row["payload_json"])["event"] == "send_\\udc00"
    assert json.loads(row["payload_json"])["columns"] == ["event"]


async def test_a_database_refusing_every_row_is_not_papered_over(log: ActivityLog) -> None:
    """When even a replacement row is refused the fault is the database's: commit() raises,
    nothing is replaced, and the rows land once the database accepts them again."""
    with sqlite3.connect(log.path, isolation_level=None) as conn:
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON activity_log"
            " BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    conn.close()
    for i in range(5):
        log.record(LogEvent.SEND_START, message_id=f"m{i}")
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable, match="refused"):
            await log.commit()
    assert log.rows_unwritable == 0
    with sqlite3.connect(log.path, isolation_level=None) as conn:
        conn.execute("DROP TRIGGER refuse")
    conn.close()
    async with asyncio.timeout(TIMEOUT):
        await log.commit()
    assert [row["message_id"] for row in read_rows(log.path)] == [f"m{i}" for i in range(5)]


async def test_a_database_failing_for_its_own_reasons_replaces_nothing(log: ActivityLog) -> None:
    """A read-only database fails every row alone too, and since that is no row's fault none is
    replaced: commit() raises, and the rows land once the database takes writes again."""
    assert log._thread is not None and log._store.conn is not None
    conn = log._store.conn
    await log._thread.run(conn.execute, "PRAGMA query_only = 1")
    for i in range(3):
        log.record(LogEvent.SEND_START, message_id=f"m{i}")
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable, match="readonly"):
            await log.commit()
    assert log.rows_unwritable == 0
    await log._thread.run(conn.execute, "PRAGMA query_only = 0")
    async with asyncio.timeout(TIMEOUT):
        await log.commit()
    assert [row["event"] for row in read_rows(log.path)] == ["send_start"] * 3


@pytest.mark.parametrize(
    "failing_call",
    [
        3,  # the bad row alone (after the whole batch and its first half were refused)
        4,  # the bad row's replacement
        6,  # the second half, after the first half was committed
    ],
)
async def test_a_failure_while_splitting_retries_only_what_is_left(
    log: ActivityLog, failing_call: int
) -> None:
    """A disk error in the middle of a split batch keeps the parts already committed: the retry
    writes only the rest, so no row is stored twice and none is lost."""
    real = log._write_batch
    calls = 0

    async def fail_once(batch: list[tuple[str | None, ...]]) -> None:
        nonlocal calls
        calls += 1
        if calls == failing_call:
            raise sqlite3.OperationalError("disk I/O error")
        await real(batch)

    log._write_batch = fail_once  # type: ignore[method-assign]
    for i in range(4):
        log.record(LogEvent.SEND_START, message_id=f"m{i}", status="\ud800" if i == 0 else None)
    async with asyncio.timeout(TIMEOUT):
        await log.commit()
    rows = read_rows(log.path)
    assert [row["event"] for row in rows] == ["row_unwritable"] + ["send_start"] * 3
    assert [row["message_id"] for row in rows] == ["m0", "m1", "m2", "m3"]


@pytest.mark.parametrize(
    ("code", "retried"),
    [
        (sqlite3.SQLITE_BUSY, True),
        (sqlite3.SQLITE_LOCKED, True),
        (sqlite3.SQLITE_IOERR, True),
        (sqlite3.SQLITE_IOERR_WRITE, True),  # extended codes count by their primary code
        (sqlite3.SQLITE_FULL, True),
        (sqlite3.SQLITE_READONLY, False),
        (sqlite3.SQLITE_CORRUPT, False),
        (sqlite3.SQLITE_TOOBIG, False),
        (sqlite3.SQLITE_CONSTRAINT_TRIGGER, False),
    ],
)
def test_which_errors_are_retried_as_is(code: int, retried: bool) -> None:
    """Lock, disk and memory trouble is retried as is; anything else splits the batch."""
    from bus.log.store import retry_as_is as _retry_as_is

    exc = sqlite3.OperationalError("x")
    exc.sqlite_errorcode = code
    assert _retry_as_is(exc) is retried
    assert not _retry_as_is(UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"))
    assert not _retry_as_is(sqlite3.IntegrityError("x"))
    assert _retry_as_is(sqlite3.OperationalError("raised by hand, without a code"))
    assert _retry_as_is(MemoryError())


@pytest.mark.parametrize(
    ("exc", "replaced"),
    [
        (sqlite3.IntegrityError("CHECK constraint failed"), True),
        (sqlite3.DataError("string or blob too big"), True),
        (sqlite3.ProgrammingError("Error binding parameter 1"), True),
        (OverflowError("Python int too large to convert to SQLite INTEGER"), True),
        (sqlite3.OperationalError("attempt to write a readonly database"), False),
        (sqlite3.DatabaseError("database disk image is malformed"), False),
        (sqlite3.InternalError("x"), False),
    ],
)
def test_which_refusals_replace_a_row(exc: Exception, replaced: bool) -> None:
    """A lone row of valid text is replaced only for an error a row can cause; one that is not
    valid text always is."""
    from bus.log.rows import refused_for_content as _refused_for_content

    text = ("ts", "connect", "m1", None, "peer", None, None, None, None)
    assert _refused_for_content(text, exc) is replaced
    assert _refused_for_content(("ts", "connect", "\ud800", *text[3:]), exc)


# The file under the log


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_deleted_or_replaced_file_stops_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """Once the file at the log's path is gone or another file, commit() raises for good,
    record() buffers up to queue_max, and one ERROR names the problem."""
    path = tmp_path / "activity.db"
    log = ActivityLog(path, queue_max=5)
    await log.open()
    async with asyncio.timeout(TIMEOUT):
        await log.write(LogEvent.CONNECT)
    if how == "deleted":
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
    else:
        other = tmp_path / "other.db"
        async with ActivityLog(other) as fresh:
            await fresh.write(LogEvent.CONNECT)
        other.replace(path)
    log.record(LogEvent.SEND_START, message_id="after")
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable, match=f"{how}.*restart the bus"):
            await log.commit()
        with pytest.raises(AuditUnavailable, match=how):
            await log.write(LogEvent.SEND_START)
    for _ in range(3):
        log.record(LogEvent.CONNECT)
    with pytest.raises(AuditUnavailable, match="backlog is full"):
        log.record(LogEvent.CONNECT)
    errors = [r for r in caplog.records if r.levelname == "ERROR" and how in r.getMessage()]
    assert len(errors) == 1
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable, match="5 rows unwritten"):
            await log.close()
    if how == "replaced":
        assert [row["message_id"] for row in read_rows(path)] == [None]  # fresh's row only


# The WAL


@pytest.mark.parametrize(
    ("rows", "per_commit", "checkpoint_rows", "checkpoint_bytes", "bound"),
    [
        # A checkpoint every 2,000 rows: at most 2,500 rows of WAL (~0.5 MB measured).
        (60_000, 500, 2_000, None, 1024 * 1024),
        # A message a transaction writes ~6 pages for 4 rows: SQLite's own checkpoint at
        # checkpoint_bytes bounds it (113 MB of WAL for these 20,000 rows with rows alone).
        (20_000, 4, 20_000, 1024 * 1024, 1024 * 1024 + 256 * 1024),
    ],
)
async def test_the_wal_stays_bounded_under_load(
    tmp_path: Path,
    rows: int,
    per_commit: int,
    checkpoint_rows: int,
    checkpoint_bytes: int | None,
    bound: int,
) -> None:
    """Under steady writes the -wal file never grows past the checkpoint threshold, in rows or
    bytes, plus one transaction; every row is kept."""
    path = tmp_path / "activity.db"
    largest = 0
    log = ActivityLog(path, checkpoint_rows=checkpoint_rows, checkpoint_bytes=checkpoint_bytes)
    async with log:
        async with asyncio.timeout(TIMEOUT * 6):
            for batch in range(rows // per_commit):
                for n in range(per_commit):
                    log.record(LogEvent.SEND_START, message_id=f"m-{batch}-{n}", actor="tg:bench")
                await log.commit()
                largest = max(largest, wal_size(path))
            await idle(log)
        assert log.checkpoints >= rows // checkpoint_rows
    assert largest <= bound
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM activity_log").fetchone() == (rows + 1,)
    conn.close()


async def test_a_reader_holding_a_snapshot_only_delays_truncation(log: ActivityLog) -> None:
    """A checkpoint that a reader's open snapshot stops from finishing neither fails nor waits;
    a later one truncates the WAL once the reader is done."""
    log._store.checkpoint_rows = 100
    reader = sqlite3.connect(log.path, isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM activity_log").fetchall()  # holds a snapshot
        async with asyncio.timeout(TIMEOUT):
            for _ in range(3):
                for _ in range(100):
                    log.record(LogEvent.CONNECT)
                await log.commit()
            await idle(log)
        assert log.checkpoints == 0
        assert wal_size(log.path) > 0
    finally:
        reader.close()
    async with asyncio.timeout(TIMEOUT):
        for _ in range(100):
            log.record(LogEvent.CONNECT)
        await log.commit()
        await idle(log)
    assert log.checkpoints == 1
    assert wal_size(log.path) == 0
    assert len(read_rows(log.path)) == 400


async def test_a_row_refused_for_a_text_column_keeps_only_its_timestamp(log: ActivityLog) -> None:
    """When the database refuses a row for a column that is valid text, the replacement that
    keeps only the timestamp and the digest is written instead."""
    with sqlite3.connect(log.path, isolation_level=None) as conn:
        conn.execute(
            "CREATE TRIGGER no_evil BEFORE INSERT ON activity_log WHEN NEW.actor = 'evil'"
            " BEGIN SELECT RAISE(ABORT, 'no evil'); END"
        )
    conn.close()
    log.record(LogEvent.CONNECT, actor="evil", message_id="m1")
    log.record(LogEvent.CONNECT, actor="good")
    async with asyncio.timeout(TIMEOUT):
        await log.commit()
    first, second = read_rows(log.path)
    assert (first["event"], first["actor"], first["message_id"]) == ("row_unwritable", None, None)
    assert json.loads(first["payload_json"])["columns"] == []
    assert "no evil" in first["error"]
    assert second["actor"] == "good"


async def test_a_path_that_cannot_be_checked_stops_the_log(tmp_path: Path) -> None:
    """If the log's path cannot even be looked up (its directory replaced by a file), the log
    fails closed as for a deleted file."""
    directory = tmp_path / "logs"
    log = ActivityLog(directory / "activity.db")
    await log.open()
    directory.rename(tmp_path / "moved")
    directory.write_text("not a directory")
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable, match="not checkable"):
            await log.write(LogEvent.CONNECT)
        with pytest.raises(AuditUnavailable, match="1 rows unwritten"):
            await log.close()


async def test_a_writer_cancelled_during_a_write_fails_its_waiters(log: ActivityLog) -> None:
    """A writer cancelled while its batch is on the thread (a bug) fails its committers; the
    thread's late answer is dropped."""
    inserts = Inserts(log, blocked=True)
    log.record(LogEvent.CONNECT)
    committing = asyncio.create_task(log.commit())
    async with asyncio.timeout(TIMEOUT):
        await inserts.entered.wait()
    assert log._writer is not None
    log._writer.cancel()
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(AuditUnavailable):
            await committing
    inserts.release.set()
    async with asyncio.timeout(TIMEOUT):
        await idle(log)
    assert len(read_rows(log.path)) == 1  # written, though nobody heard of it
    log._pending.clear()  # so the fixture's close() does not report it as unwritten
