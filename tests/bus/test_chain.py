"""The activity log's hash chain on real database files: what verify catches, and what it does not
mistake for tampering (batches, replaced rows, restarts, a second writer, migration)."""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest

from bus import cli
from bus.core.logevents import LogEvent
from bus.log import audit
from bus.log.activity import ActivityLog
from bus.log.chain import ChainBroken
from bus.log.chain_v1 import default_key_path, encode_row, fields_of, key_id
from bus.log.checkpoints import Checkpointer, SigningKey
from bus.log.schema import SCHEMA

TIMEOUT = 10.0

# The append-only triggers an attacker with write access drops first.
DROP_TRIGGERS = (
    "DROP TRIGGER activity_log_no_update; DROP TRIGGER activity_log_no_delete;"
    "DROP TRIGGER activity_log_no_replace;"
)
# ... and creates again afterwards, exactly as they were.
TRIGGERS = SCHEMA[SCHEMA.index("CREATE TRIGGER") :]


async def write_log(path: Path, **options: Any) -> None:
    """Rows in several batches: ids 2-31 sends, 32 a refusal, 33 a rejected approval."""
    async with asyncio.timeout(TIMEOUT), ActivityLog(path, **options) as log:
        for batch in range(3):
            for n in range(10):
                log.record(
                    LogEvent.SEND_START, message_id=f"m-{batch}-{n}", actor="tg:1", payload={"n": n}
                )
            await log.commit()
        log.record(LogEvent.REFUSED, actor="tg:1", status="type_denied")
        log.record(
            LogEvent.BCP_APPROVAL_DECIDED, actor="human:ann", status="rejected", payload={"a": 1}
        )
        await log.commit()


@pytest.fixture
async def db(tmp_path: Path) -> Path:
    path = tmp_path / "bcpbus.db"
    await write_log(path)
    return path


def tamper(db: Path, sql: str) -> None:
    """Run ``sql`` on the file as an attacker would: a plain connection, no bcpbus code."""
    conn = sqlite3.connect(db)
    try:
        conn.executescript(sql)
    finally:
        conn.close()


def verify(db: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``bcpbus audit verify`` in this process: its exit code and the first line it prints."""
    code = cli.main(["audit", "verify", "--db", str(db), *args])
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("note")]
    return code, lines[0] if lines else ""


# An intact log


def test_an_untouched_log_verifies_with_its_row_count_and_head(db: Path, capsys) -> None:
    """Several batches and the chain_start row: exit 0, the rows counted, the head printed."""
    code, line = verify(db, capsys=capsys)
    row_id, chain = audit.head(db)
    assert code == 0 and line.startswith("ok: 33 rows intact") and f"{row_id}:{chain}" in line
    assert row_id == 33


async def test_replaced_rows_restarts_and_a_second_writer_keep_the_chain(tmp_path: Path) -> None:
    """A row_unwritable replacement, reopening the log, and two logs on one file all chain."""
    path = tmp_path / "bcpbus.db"
    await write_log(path)
    async with asyncio.timeout(TIMEOUT):
        async with ActivityLog(path) as first, ActivityLog(path) as second:
            first.record(LogEvent.SEND_START, message_id="ok-1")
            first.record(LogEvent.SEND_START, message_id="bad-\ud800")  # SQLite refuses it alone
            second.record(LogEvent.SUBSCRIBE, actor="gateway", topic="bcp:*")
            first.record(LogEvent.SEND_FINISH, message_id="ok-1")
            await asyncio.gather(first.commit(), second.commit())
        assert first.rows_unwritable == 1
    result = audit.verify(path)
    assert result.ok, result.problems
    assert result.rows == 37 and len(result.segments) == 1


# Each tampering, on a real file


def test_an_update_with_the_triggers_dropped_is_named(db: Path, capsys) -> None:
    """Rewriting the rejected approval as approved names that row."""
    tamper(db, DROP_TRIGGERS + "UPDATE activity_log SET status = 'approved' WHERE id = 33;")
    code, line = verify(db, capsys=capsys)
    assert code == 1 and line.startswith("row 33: it does not match its hash")


def test_a_delete_in_the_middle_is_named(db: Path, capsys) -> None:
    """Deleting the refusal names the row after it, and which one is missing."""
    tamper(db, DROP_TRIGGERS + "DELETE FROM activity_log WHERE id = 32;")
    code, line = verify(db, capsys=capsys)
    assert code == 1 and line == "row 33: row 32 before it is missing: removed"


def test_a_forged_insert_is_named(db: Path, capsys) -> None:
    """A plain INSERT of a back-dated approval passes the triggers but not the chain."""
    tamper(
        db,
        "INSERT INTO activity_log (ts, event, actor, status) VALUES "
        "('2020-01-01T00:00:00.000000Z', 'bcp_approval_decided', 'human:ann', 'approved');",
    )
    code, line = verify(db, capsys=capsys)
    assert code == 1 and line.startswith("row 34: it has no hash")
    # One with a made-up hash fares no better.
    forged = "ab" * 32
    tamper(
        db,
        "INSERT INTO activity_log (ts, event, status, chain) VALUES "
        f"('2020-01-01T00:00:00.000000Z', 'bcp_approval_decided', 'approved', '{forged}');",
    )
    assert audit.verify(db).problems[1].row == 35


def test_rows_reordered_in_the_middle_are_named(db: Path) -> None:
    """Two rows swapped (ids kept in order, contents exchanged) name the first of them."""
    tamper(
        db,
        DROP_TRIGGERS
        + "UPDATE activity_log SET id = -1 WHERE id = 10;"
        + "UPDATE activity_log SET id = 10 WHERE id = 11;"
        + "UPDATE activity_log SET id = 11 WHERE id = -1;",
    )
    problems = audit.verify(db).problems
    assert problems[0].row == 10 and "does not match" in problems[0].why


def test_a_rebuilt_table_is_named(db: Path, capsys) -> None:
    """The whole attack: triggers dropped, a rejection rewritten, the refusal deleted, the ids
    renumbered, the id counter reset and the triggers created again."""
    tamper(
        db,
        DROP_TRIGGERS
        + "UPDATE activity_log SET status = 'approved' WHERE id = 33;"
        + "DELETE FROM activity_log WHERE event = 'refused';"
        + "UPDATE activity_log SET id = id - 1 WHERE id > 32;"
        + "UPDATE sqlite_sequence SET seq = 32 WHERE name = 'activity_log';"
        + TRIGGERS,
    )
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert audit.refusals_per_reason(db) == []
    code, line = verify(db, capsys=capsys)
    assert code == 1 and line.startswith("row 32: it does not match its hash")


def test_a_truncated_tail_is_caught_by_the_expected_head(db: Path, capsys) -> None:
    """Cutting the last rows leaves a chain that verifies; the head kept elsewhere catches it."""
    row_id, chain = audit.head(db)
    tamper(db, DROP_TRIGGERS + "DELETE FROM activity_log WHERE id >= 32;" + TRIGGERS)
    assert verify(db, capsys=capsys)[0] == 0
    code, line = verify(db, "--expect-head", f"{row_id}:{chain}", capsys=capsys)
    assert code == 1 and "row 33, is not in the log (it ends at row 31)" in line
    code, line = verify(db, "--expect-head", f"20:{chain}", capsys=capsys)
    assert code == 1 and line.startswith("row 20: its hash is not the expected head's")


def test_a_dropped_trigger_alone_is_reported(db: Path, capsys) -> None:
    """A trigger dropped with nothing else changed still fails verify, naming it."""
    tamper(db, "DROP TRIGGER activity_log_no_delete;")
    code, line = verify(db, capsys=capsys)
    assert code == 1 and "its trigger activity_log_no_delete was dropped" in line


async def test_a_row_forged_while_the_log_is_open_is_reported_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain INSERT by another connection while the bus writes: the next batch says so."""
    path = tmp_path / "bcpbus.db"
    async with asyncio.timeout(TIMEOUT), ActivityLog(path) as log:
        await log.write(LogEvent.SEND_START, message_id="a")
        tamper(path, "INSERT INTO activity_log (ts, event, status) VALUES ('x', 'forged', 'ok');")
        await log.write(LogEvent.SEND_START, message_id="b")
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "row 3, written by another connection, does not verify: it has no hash" in error
    problems = audit.verify(path).problems
    assert [p.row for p in problems] == [3]


# Opening a log: the start-up check


async def test_opening_a_log_with_a_broken_tail_is_refused_naming_the_row(db: Path) -> None:
    """A rewritten row near the end stops the log from opening, unless the break is accepted;
    then a chain_start row records it and the new segment verifies with --from."""
    tamper(db, DROP_TRIGGERS + "UPDATE activity_log SET status = 'approved' WHERE id = 33;")
    with pytest.raises(ChainBroken) as refused:
        await ActivityLog(db).open()
    assert refused.value.row == 33 and "row 33: it does not match" in str(refused.value)
    async with asyncio.timeout(TIMEOUT), ActivityLog(db, accept_broken=True) as log:
        assert log.started == "broken_log_accepted"
        await log.write(LogEvent.SEND_START, message_id="after")
    start = (
        sqlite3.connect(db)
        .execute("SELECT id, payload_json FROM activity_log WHERE status = 'broken_log_accepted'")
        .fetchone()
    )
    assert json.loads(start[1])["broken"]["row"] == 33
    assert audit.verify(db).problems[0].row == 33
    assert audit.verify(db, start=start[0]).ok
    # The triggers were created again, and the log opens as usual from now on.
    async with ActivityLog(db) as log:
        assert log.started is None


async def test_opening_a_log_whose_trigger_was_dropped_is_refused(db: Path) -> None:
    """A dropped trigger is not silently created again."""
    tamper(db, "DROP TRIGGER activity_log_no_update;")
    with pytest.raises(ChainBroken, match="trigger activity_log_no_update was dropped"):
        await ActivityLog(db).open()


# Files


async def test_database_wal_shm_and_checkpoints_are_created_0600(tmp_path: Path) -> None:
    """Whatever the umask, the log's files are the owner's alone, and no chain key is made."""
    old = os.umask(0o022)
    try:
        path = tmp_path / "new" / "bcpbus.db"
        sink = Checkpointer(SigningKey.generate("test/bcpbus"), tmp_path / "new" / "cp")
        async with ActivityLog(path, checkpoints=sink) as log:
            await log.write(LogEvent.CONNECT, actor="x")
            files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
            modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in files}
        modes["cp"] = stat.S_IMODE((tmp_path / "new" / "cp").stat().st_mode)
    finally:
        os.umask(old)
    assert modes == dict.fromkeys(modes, 0o600) and len(modes) == 4
    assert not default_key_path(path).exists()


async def test_the_head_is_shipped_every_n_rows_and_verifies(tmp_path: Path) -> None:
    """Head lines appended as rows commit; each one is a head verify accepts."""
    path, heads = tmp_path / "bcpbus.db", tmp_path / "heads.txt"
    await write_log(path, head=heads, head_every_rows=10, head_every_seconds=None)
    lines = heads.read_text().split()
    assert len(lines) >= 4 and lines[-1] == "{}:{}".format(*audit.head(path))
    for line in lines:
        assert audit.verify(path, expect_head=line).ok


# Migration of a log written before the chain


OLD_SCHEMA = """
CREATE TABLE activity_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts TEXT NOT NULL, event TEXT NOT NULL,
    message_id TEXT, rpc_id TEXT, actor TEXT, topic TEXT, status TEXT, payload_json TEXT,
    error TEXT
);
CREATE INDEX idx_activity_message_id ON activity_log(message_id);
CREATE INDEX idx_activity_ts ON activity_log(ts);
"""


def old_log(path: Path) -> None:
    """A log as the previous version wrote it: no chain column, its triggers, five rows."""
    conn = sqlite3.connect(path)
    with conn:
        conn.executescript(OLD_SCHEMA + TRIGGERS)
        for n in range(5):
            conn.execute(
                "INSERT INTO activity_log (ts, event, message_id) VALUES (?, 'send_start', ?)",
                (f"2026-05-09T10:00:0{n}.000000Z", f"old-{n}"),
            )
    conn.close()


async def test_a_log_of_the_previous_version_is_migrated_and_chained(tmp_path: Path) -> None:
    """Its column is added, a chain_start row binds its rows, and later rows chain on."""
    path = tmp_path / "bcpbus.db"
    old_log(path)
    async with asyncio.timeout(TIMEOUT), ActivityLog(path) as log:
        assert log.started == "migrated"
        await log.write(LogEvent.SEND_START, message_id="new-1")
    rows = audit.query_rows(path)
    assert [r["event"] for r in rows[5:]] == ["chain_start", "send_start"]
    assert [r["chain"] is None for r in rows] == [True] * 5 + [False] * 2
    assert json.loads(rows[5]["payload_json"])["previous"]["rows"] == 5
    assert audit.verify(path).ok
    # The rows from before the chain are bound too: changing one shows at the chain_start.
    tamper(path, DROP_TRIGGERS + "UPDATE activity_log SET message_id = 'x' WHERE id = 2;")
    problem = audit.verify(path).problems[0]
    assert problem.row == 6 and "rows before it were changed" in problem.why


# Logs chained by version 1 (an HMAC under a key beside the database)


def v1_log(path: Path, rows: int = 4) -> bytes:
    """A log as version 1 wrote it: a chain_start and ``rows`` sends, HMAC-chained; its key."""
    key = bytes(range(32))
    default_key_path(path).write_text(key.hex() + "\n")
    default_key_path(path).chmod(0o600)
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    names = ["id", "ts", "event", "message_id", "status", "payload_json", "epoch"]
    fields = fields_of(names)
    prev = bytes(32)
    start = json.dumps({"chain": 1, "key_id": key_id(key), "previous": None})
    for n in range(rows + 1):
        values = [n + 1, f"2026-05-09T10:00:0{n}.000000Z"]
        values += (
            ["chain_start", None, "new", start, None]
            if n == 0
            else ["send_start", f"m-{n}", None, None, n]
        )
        mac = hmac.new(key, (bytes(32) if n == 0 else prev) + encode_row(fields, values), "sha256")
        prev = mac.digest()
        marks = ",".join("?" * (len(names) + 1))
        conn.execute(
            f"INSERT INTO activity_log ({','.join(names)}, chain) VALUES ({marks})",
            [*values, prev.hex()],
        )
    conn.commit()
    conn.close()
    return key


def test_a_version_1_log_verifies_with_its_key_and_says_so_without(tmp_path: Path, capsys) -> None:
    """verify checks a version-1 log with the key beside it, and without it names the version
    instead of failing on every row."""
    db = tmp_path / "bcpbus.db"
    v1_log(db)
    code, line = verify(db, capsys=capsys)
    assert code == 0 and line.startswith("ok: 5 rows intact")
    default_key_path(db).rename(tmp_path / "elsewhere.key")
    code, line = verify(db, capsys=capsys)
    assert code == 1 and "chained by an earlier version (chain 1, an HMAC)" in line
    tamper(db, DROP_TRIGGERS + "UPDATE activity_log SET message_id = 'x' WHERE id = 3;")
    code, line = verify(db, "--key", str(tmp_path / "elsewhere.key"), capsys=capsys)
    assert code == 1 and line.startswith("row 3: it does not match its hash")


async def test_opening_a_version_1_log_checks_it_then_chains_on_with_version_2(
    tmp_path: Path,
) -> None:
    """The first open verifies the old chain with its key, then an `upgraded` chain_start binds
    it, so verify needs no key afterwards and still sees an old row changed."""
    db = tmp_path / "bcpbus.db"
    v1_log(db)
    async with asyncio.timeout(TIMEOUT), ActivityLog(db) as log:
        assert log.started == "upgraded"
        await log.write(LogEvent.SEND_START, message_id="new")
    default_key_path(db).unlink()
    result = audit.verify(db)
    assert result.ok and result.rows == 7 and "chained by an earlier version" in result.notes[0]
    tamper(db, DROP_TRIGGERS + "UPDATE activity_log SET message_id = 'x' WHERE id = 3;")
    problem = audit.verify(db).problems[0]
    assert problem.row == 6 and "rows before it were changed" in problem.why


async def test_opening_a_version_1_log_without_its_key_is_refused(tmp_path: Path) -> None:
    """A missing version-1 key is not papered over: the old chain could not be checked."""
    db = tmp_path / "bcpbus.db"
    v1_log(db)
    default_key_path(db).unlink()
    with pytest.raises(ChainBroken, match="chained by an earlier version .* key .* is missing"):
        await ActivityLog(db).open()
