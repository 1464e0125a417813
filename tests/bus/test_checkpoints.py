"""Signed checkpoints of the activity log on real files: what `audit verify --pubkey` catches
with nothing but the public key, including forgeries re-chained with everything an auditor has."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import sqlite3
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from bus import cli
from bus.core.logevents import LogEvent
from bus.log import audit
from bus.log.activity import ActivityLog
from bus.log.chain import GENESIS, INTEGER_COLUMNS, Chainer, Head, canonical_row
from bus.log.chain_v1 import encode_row as encode_v1, fields_of as fields_v1
from bus.log.checkpoints import (
    Checkpoint,
    Checkpointer,
    KeyExposed,
    SigningKey,
    VerifierKey,
    create_signing_key,
    load_signing_key,
    read_notes,
)
from bus.log.logfile import _expected
from bus.log.rows import COLUMNS
from bus.log.schema import SCHEMA

from .test_chain import DROP_TRIGGERS, TRIGGERS, tamper

TIMEOUT = 10.0


@pytest.fixture
def signer(tmp_path: Path) -> tuple[Path, Path]:
    """A signing key made as `bcpbus audit keygen` makes it: the key and its .pub."""
    key = tmp_path / "keys" / "signing.key"
    public, _ = create_signing_key(key, "test.example/bcpbus")
    return key, public


async def write_signed(db: Path, key: Path, *, rows: int = 30, every: int = 10) -> None:
    """``rows`` sends in batches of 5, a checkpoint every ``every`` rows and one at close."""
    sink = Checkpointer(load_signing_key(key), f"{db}.checkpoints")
    options: dict[str, Any] = {"head_every_rows": every, "head_every_seconds": None}
    async with asyncio.timeout(TIMEOUT), ActivityLog(db, checkpoints=sink, **options) as log:
        for n in range(rows):
            log.record(LogEvent.SEND_START, message_id=f"m-{n}", actor="tg:1", epoch=n + 1)
            if n % 5 == 4:
                await log.commit()
        log.record(LogEvent.BCP_APPROVAL_DECIDED, actor="human:ann", status="rejected")


@pytest.fixture
async def db(tmp_path: Path, signer: tuple[Path, Path]) -> Path:
    path = tmp_path / "bcpbus.db"
    await write_signed(path, signer[0])
    return path


def verify(db: Path, public: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """`bcpbus audit verify --pubkey` in this process: exit code and first line that is not a
    note."""
    code = cli.main(["audit", "verify", "--db", str(db), "--pubkey", str(public)])
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("note")]
    return code, lines[0] if lines else ""


def rechain(db: Path) -> None:
    """Recompute every row's chain from the rows, as anyone holding the database can: the chain
    needs no secret. This is what hides an edit from the chain alone."""
    conn = sqlite3.connect(db)
    conn.executescript(DROP_TRIGGERS)
    conn.row_factory = sqlite3.Row
    prev = GENESIS
    for row in conn.execute("SELECT * FROM activity_log ORDER BY id").fetchall():
        content = {name: row[name] for name in row.keys() if name != "chain"}
        if row["event"] == "chain_start":
            prev = GENESIS
        prev = hashlib.sha256(prev + canonical_row(content)).digest()
        conn.execute("UPDATE activity_log SET chain = ? WHERE id = ?", (prev.hex(), row["id"]))
    conn.commit()
    conn.executescript(TRIGGERS)
    conn.close()


def remove(db: Path) -> None:
    """Delete the database and its -wal and -shm files."""
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        path.unlink(missing_ok=True)


# An intact log


def test_an_intact_signed_log_verifies_with_the_public_key_alone(
    db: Path, signer: tuple[Path, Path], capsys
) -> None:
    """No secret: the .pub and the checkpoint file beside the database; the last checkpoint,
    written at close, signs the last row."""
    code, line = verify(db, signer[1], capsys)
    assert code == 0 and line.startswith("ok: 32 rows intact")
    assert "5 checkpoints verify, the last at row 32" in line
    notes = read_notes(Path(f"{db}.checkpoints").read_text())
    assert [Checkpoint.from_text(n.text).size for n in notes] == [1, 11, 21, 31, 32]


def test_a_signed_note_reads_as_go_sumdb_note_writes_it() -> None:
    """The signed-note test vector of golang.org/x/mod/sumdb/note verifies here."""
    key = VerifierKey.from_text(
        "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
    )
    sig = (
        "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72Ine"
        "yaQM="
    )
    [note] = read_notes(f"This is an example message.\n\n\u2014 example.com/foo {sig}\n")
    [(name, blob)] = note.signatures
    assert name == key.name and blob[:4] == key.key_id
    assert key.verify(note.text, blob[4:]) and not key.verify("Another message.\n", blob[4:])


# What the chain alone names


def test_an_edited_row_is_named_by_the_chain(db: Path, signer, capsys) -> None:
    """An approval rewritten without re-chaining: the row itself."""
    tamper(db, DROP_TRIGGERS + "UPDATE activity_log SET status = 'approved' WHERE id = 32;")
    code, line = verify(db, signer[1], capsys)
    assert code == 1 and line.startswith("row 32: it does not match its hash")


def test_a_storage_class_change_is_named(db: Path, signer, capsys) -> None:
    """An integer epoch stored as text with the same digits (the table rebuilt with the column
    declared TEXT): version 1's encoding hashed both alike, version 2's does not."""
    row = dict(sqlite3.connect(db).execute("SELECT id, epoch FROM activity_log WHERE id = 7"))
    assert row == {7: 6}
    tamper(
        db,
        DROP_TRIGGERS
        + "ALTER TABLE activity_log RENAME TO old;"
        + SCHEMA.split(";")[0].replace("epoch INTEGER", "epoch TEXT")
        + "; INSERT INTO activity_log SELECT * FROM old; DROP TABLE old;"
        + TRIGGERS,
    )
    conn = sqlite3.connect(db)
    assert conn.execute(
        "SELECT typeof(epoch), epoch FROM activity_log WHERE id = 7"
    ).fetchone() == (
        "text",
        "6",
    )
    fields = fields_v1(["id", "epoch"])
    assert encode_v1(fields, [7, 6]) == encode_v1(fields, [7, "6"])  # the hole version 1 had
    code, line = verify(db, signer[1], capsys)
    assert code == 1 and line.startswith("row 2: it does not match its hash")


def test_integer_columns_are_those_the_schema_declares_integer() -> None:
    """The writer tags the text of these columns as integers: exactly SQLite's INTEGER ones."""
    declared = {name for name, kind in _expected(SCHEMA).columns if kind == "INTEGER"}
    assert declared == INTEGER_COLUMNS


# What only the checkpoints catch: forgeries re-chained with everything an auditor has


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("UPDATE activity_log SET status = 'approved' WHERE id = 32;", "row 32 is not the row"),
        (
            "DELETE FROM activity_log WHERE id = 15;"
            "UPDATE activity_log SET id = id - 1 WHERE id > 15;",
            "row 21 is not the row",
        ),
        (
            "UPDATE activity_log SET id = -1 WHERE id = 10;"
            "UPDATE activity_log SET id = 10 WHERE id = 11;"
            "UPDATE activity_log SET id = 11 WHERE id = -1;",
            "row 11 is not the row",
        ),
    ],
    ids=["edited", "deleted", "reordered"],
)
def test_a_rechained_forgery_is_caught_by_the_checkpoints(
    db: Path, signer, capsys, sql: str, named: str
) -> None:
    """Edited, deleted (ids renumbered) or reordered rows, the whole chain then recomputed: the
    chain holds, the first checkpoint past the change does not."""
    tamper(db, DROP_TRIGGERS + sql + TRIGGERS)
    rechain(db)
    assert audit.verify(db).ok  # the chain alone is fooled
    code, line = verify(db, signer[1], capsys)
    assert code == 1 and named in line and "re-chained" in line, line


def test_a_forged_checkpoint_does_not_verify(db: Path, signer, capsys) -> None:
    """Re-chained after an edit, with checkpoints made anew by a key of the same name (what a
    forger holding the database, the public key and even a version-1 key can do): refused."""
    tamper(
        db, DROP_TRIGGERS + "UPDATE activity_log SET status = 'approved' WHERE id = 32;" + TRIGGERS
    )
    rechain(db)
    forger = SigningKey.generate("test.example/bcpbus")
    head = sqlite3.connect(db).execute("SELECT id, chain FROM activity_log WHERE id = 32")
    row_id, chain = head.fetchone()
    Path(f"{db}.checkpoints").write_text(
        forger.sign(Checkpoint(forger.name, row_id, bytes.fromhex(chain)).text())
    )
    code, line = verify(db, signer[1], capsys)
    assert code == 1 and "it is not signed by test.example/bcpbus" in line
    # The genuine signature over another text (a changed root hash) fails outright.
    genuine = load_signing_key(signer[0]).sign(Checkpoint(forger.name, 32, bytes(32)).text())
    Path(f"{db}.checkpoints").write_text(genuine.replace("\n32\n", "\n31\n"))
    code, line = verify(db, signer[1], capsys)
    assert code == 1 and "its signature does not verify" in line


def test_a_cut_tail_is_caught_by_the_checkpoint_file(db: Path, signer, capsys) -> None:
    """Rows cut from the end leave an intact chain, and fewer rows than the last checkpoint."""
    tamper(db, DROP_TRIGGERS + "DELETE FROM activity_log WHERE id > 25;" + TRIGGERS)
    assert audit.verify(db).ok
    code, line = verify(db, signer[1], capsys)
    assert code == 1 and "it signed row 31, but the log ends at row 25: rows were cut" in line


async def test_a_replaced_or_emptied_log_is_caught(
    db: Path, signer, capsys, tmp_path: Path
) -> None:
    """A new log in the old one's place (its own intact chain), or every row deleted."""
    remove(db)
    async with ActivityLog(db) as log:
        for n in range(40):
            log.record(LogEvent.SEND_START, message_id=f"other-{n}")
    assert audit.verify(db).ok
    code, line = verify(db, signer[1], capsys)
    assert code == 1 and "row 1 is not the row it signed" in line
    tamper(db, DROP_TRIGGERS + "DELETE FROM activity_log;" + TRIGGERS)
    code, line = verify(db, signer[1], capsys)
    assert code == 1 and "the log ends at row 0" in line


def test_a_deleted_checkpoint_file_is_not_a_pass(db: Path, signer, capsys) -> None:
    """Without its checkpoints nothing vouches for the log: verify --pubkey fails and says so."""
    Path(f"{db}.checkpoints").unlink()
    code, line = verify(db, signer[1], capsys)
    assert code == 1 and "there is no checkpoint file" in line


async def test_rows_after_the_last_checkpoint_are_noted_not_failed(
    tmp_path: Path, signer, capsys
) -> None:
    """A bus killed between checkpoints leaves rows chained but unsigned: a note, exit 0."""
    db = tmp_path / "bcpbus.db"
    await write_signed(db, signer[0], rows=10, every=1000)
    async with ActivityLog(db) as log:  # a writer that signs nothing
        log.record(LogEvent.SEND_START, message_id="late")
    cli.main(["audit", "verify", "--db", str(db), "--pubkey", str(signer[1])])
    out = capsys.readouterr().out
    assert "note: rows 13-13 come after the last checkpoint" in out and "ok: 13 rows" in out


class Watched(Checkpointer):
    """A real :class:`Checkpointer` that lets a test wait for the log's turns: each time the
    log hands it a head (every timer tick, moved or not), it counts and notifies."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.signed: list[int] = []
        self.turns = 0
        self._turned = threading.Condition()

    def write(self, head: Head) -> None:
        super().write(head)
        with self._turned:
            self.signed.append(head.id)
            self.turns += 1
            self._turned.notify_all()

    async def wait_for(self, done: Callable[[], bool]) -> None:
        """Return once ``done()`` holds after a turn; fail after TIMEOUT seconds."""

        def wait() -> bool:
            with self._turned:
                return self._turned.wait_for(done, TIMEOUT)

        assert await asyncio.to_thread(wait), "the log's timer never got there"


async def test_an_idle_bus_signs_rows_others_wrote_and_never_a_forged_one(
    tmp_path: Path, signer, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows a writer with no key adds (as `budget reset` does) are signed by the signing log's
    next timed checkpoint though it writes nothing itself; a row that does not verify is
    reported once and never signed."""
    db = tmp_path / "bcpbus.db"
    sink = Watched(load_signing_key(signer[0]), f"{db}.checkpoints")
    options: dict[str, Any] = {"head_every_rows": 1000, "head_every_seconds": 0.05}
    async with asyncio.timeout(TIMEOUT), ActivityLog(db, checkpoints=sink, **options) as log:
        await log.write(LogEvent.SEND_START, message_id="own")
        async with ActivityLog(db) as other:  # signs nothing
            await other.write(LogEvent.BCP_BUDGET_RESET, actor="operator:ann", status="reset")
        await sink.wait_for(lambda: max(sink.signed, default=0) >= 3)
        tamper(db, "INSERT INTO activity_log (ts, event, status) VALUES ('x', 'forged', 'ok');")
        later = sink.turns + 3
        await sink.wait_for(lambda: sink.turns >= later)
    assert max(sink.signed) == 3
    [error] = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert "row 4, written by another connection, does not verify" in error
    assert signed_rows(db)[-1] == 3


def signed_rows(db: Path) -> list[int]:
    """The row each checkpoint in the file beside ``db`` signs, in the file's order."""
    notes = read_notes(Path(f"{db}.checkpoints").read_text())
    return [Checkpoint.from_text(note.text).size for note in notes]


# The key's files


def test_keygen_files_and_a_key_others_can_read_is_refused(
    signer: tuple[Path, Path], tmp_path: Path
) -> None:
    """The key is 0600 and its .pub 0644; a key the group can read is refused, one in the
    database's directory taken with a warning, an existing file never overwritten."""
    key, public = signer
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert VerifierKey.from_text(public.read_text()) == load_signing_key(key).verifier
    key.chmod(0o640)
    with pytest.raises(KeyExposed, match="may be read by others .*chmod 600"):
        load_signing_key(key)
    with pytest.raises(FileExistsError, match="never overwritten"):
        create_signing_key(key, "test.example/bcpbus")


def test_a_key_beside_the_database_is_taken_with_a_warning(
    signer: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Whoever can replace the database there may read the key too: the warning says so."""
    with caplog.at_level(logging.WARNING, "bus.log.activity"):
        load_signing_key(signer[0], db=signer[0].parent / "bcpbus.db")
    assert "lies in the activity log's directory" in caplog.text


async def test_a_checkpoint_file_that_cannot_be_written_does_not_stop_the_log(
    tmp_path: Path, signer, caplog: pytest.LogCaptureFixture
) -> None:
    """The rows are committed and a warning says the checkpoint was not written."""
    sink = Checkpointer(load_signing_key(signer[0]), tmp_path / "missing-dir" / "cp")
    async with (
        asyncio.timeout(TIMEOUT),
        ActivityLog(
            tmp_path / "bcpbus.db", checkpoints=sink, head_every_rows=1, head_every_seconds=None
        ) as log,
    ):
        await log.write(LogEvent.SEND_START, message_id="a")
        await log.write(LogEvent.SEND_START, message_id="b")
    assert "could not write the activity log's head" in caplog.text
    assert audit.verify(tmp_path / "bcpbus.db").rows == 3


async def test_checkpoints_sent_to_syslog_verify_from_the_daemons_file(
    tmp_path: Path, signer
) -> None:
    """Each checkpoint goes to a syslog daemon (here a UDP socket) as one line; the file the
    daemon writes is a checkpoint file verify reads, other lines ignored."""
    daemon = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    daemon.bind(("127.0.0.1", 0))
    daemon.setblocking(False)
    try:
        db = tmp_path / "bcpbus.db"
        sink = Checkpointer(
            load_signing_key(signer[0]),
            f"{db}.checkpoints",
            syslog=f"127.0.0.1:{daemon.getsockname()[1]}",
        )
        async with (
            asyncio.timeout(TIMEOUT),
            ActivityLog(db, checkpoints=sink, head_every_rows=2, head_every_seconds=None) as log,
        ):
            for n in range(4):
                await log.write(LogEvent.SEND_START, message_id=f"m-{n}")
        lines = ["Nov 26 20:00:00 host sshd[1]: unrelated"]
        while True:
            try:
                lines.append("Nov 26 20:00:01 host " + daemon.recv(4096).decode())
            except BlockingIOError:
                break
    finally:
        daemon.close()
    assert len(lines) >= 3 and lines[1].split(" host ")[1].startswith("<13>bcpbus: ")
    syslog_file = tmp_path / "syslog"
    syslog_file.write_text("\n".join(lines) + "\n")
    result = audit.verify(db, pubkey=signer[1], checkpoints=[syslog_file])
    assert result.ok and result.signed is not None and result.signed.last == 5
    assert result.signed.signed == len(lines) - 1


_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.none(), _TEXT), min_size=len(COLUMNS) - 3, max_size=len(COLUMNS) - 3
    ),
    epoch=st.one_of(st.none(), st.integers(min_value=0, max_value=2**63 - 1)),
)
def test_the_writers_encoding_is_what_verify_reads_back(values, epoch) -> None:
    """Any row the writer chains (text, numbers as text, an epoch) verifies once SQLite has
    stored it with the column's affinity: the writer's class letters are the stored ones."""
    row = (
        "2026-05-09T10:00:00.000000Z",
        "send_start",
        *values[1:],
        None if epoch is None else str(epoch),
        values[0],
    )
    params, _, head = Chainer(COLUMNS).link([row], 0, None)
    conn = sqlite3.connect(":memory:")
    conn.executescript(SCHEMA)
    names = ",".join(("id", *COLUMNS, "chain"))
    conn.execute(
        f"INSERT INTO activity_log ({names}) VALUES ({','.join('?' * len(params))})", params
    )
    conn.row_factory = sqlite3.Row
    stored = dict(conn.execute("SELECT * FROM activity_log").fetchone())
    conn.close()
    assert (
        hashlib.sha256(
            GENESIS + canonical_row({k: v for k, v in stored.items() if k != "chain"})
        ).hexdigest()
        == head
    )
