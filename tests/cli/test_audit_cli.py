"""``bcpbus audit`` and ``bcpbus serve`` on the chain, through real subprocesses: the start-up
refusal, --accept-broken-log, --follow, --format jsonl."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import stat
from pathlib import Path

import pytest

from bus.core.logevents import LogEvent
from bus.log.activity import ActivityLog
from bus.log.checkpoints import Checkpoint, read_notes
from peers.testing import scaled

from .test_cli import BCPBUS, run, serving
from .test_operators import serving as serving_process, stderr_line

AGENTS = Path(__file__).parents[2] / "agents"


async def write_rows(db, *events: str) -> None:
    async with ActivityLog(db) as log:
        for n, event in enumerate(events):
            log.record(LogEvent(event), actor=f"tg:{n}", topic="agent:w1", message_id=f"m-{n}")
        await log.commit()


async def test_serve_refuses_a_broken_log_in_one_line_and_accepts_it_when_told(tmp_path):
    """A rewritten row stops `serve` with one line naming it; --accept-broken-log starts a new
    segment that `verify --from` checks."""
    db = tmp_path / "bcpbus.db"
    await write_rows(db, "send_start", "refused", "send_finish")
    with sqlite3.connect(db) as conn:
        conn.executescript(
            "DROP TRIGGER activity_log_no_update;"
            "UPDATE activity_log SET event = 'send_start' WHERE id = 3;"
        )
    conn.close()
    refused = run("serve", "--port", "0", "--no-gateway", cwd=tmp_path)
    assert refused.returncode == 2 and "listening" not in refused.stdout
    [line] = refused.stderr.splitlines()
    assert line.startswith("bcpbus: error: activity log ") and "row 3: it does not match" in line
    assert "--accept-broken-log" in line
    async with serving(tmp_path, "--no-gateway", "--accept-broken-log"):
        pass
    [start] = json.loads(run("audit", "--event", "chain_start", "--json", cwd=tmp_path).stdout)[1:]
    assert start["status"] == "broken_log_accepted" and start["payload"]["broken"]["row"] == 3
    whole = run("audit", "verify", cwd=tmp_path)
    assert whole.returncode == 1 and "row 3: it does not match" in whole.stdout
    assert f"note: row {start['id']}" in whole.stdout
    since = run("audit", "verify", "--from", str(start["id"]), cwd=tmp_path)
    assert since.returncode == 0, since.stdout
    # The triggers are back: the next start needs no flag.
    async with serving(tmp_path, "--no-gateway"):
        pass


async def test_serve_ships_the_head_and_verify_takes_it_back(tmp_path):
    """`serve --audit-head FILE` appends ID:HASH lines; the last one is the log's head."""
    async with serving(tmp_path, "--no-gateway", "--audit-head", "heads.txt"):
        pass
    heads = (tmp_path / "heads.txt").read_text().split()
    head = run("audit", "head", cwd=tmp_path).stdout.strip()
    assert heads and heads[-1] == head
    assert run("audit", "verify", "--expect-head", heads[0], cwd=tmp_path).returncode == 0


async def test_follow_prints_new_rows_that_pass_the_filters(tmp_path):
    """`audit --follow --event send_start --format jsonl` prints the matching rows already there,
    then each new matching one, and nothing else."""
    db = tmp_path / "bcpbus.db"
    await write_rows(db, "send_start", "connect")
    process = await asyncio.create_subprocess_exec(
        *BCPBUS,
        "audit",
        "--follow",
        "--event",
        "send_start",
        "--format",
        "jsonl",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            first = json.loads(await process.stdout.readline())
            assert first["message_id"] == "m-0"
            await write_rows(db, "connect", "send_start")
            second = json.loads(await process.stdout.readline())
        assert second["event"] == "send_start" and second["actor"] == "tg:1"
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()


async def test_jsonl_has_one_object_a_row(tmp_path):
    """--format jsonl: one JSON object per line, payload decoded."""
    await write_rows(tmp_path / "bcpbus.db", "send_start", "send_finish")
    result = run("audit", "--format", "jsonl", "--event", "send_start", cwd=tmp_path)
    [line] = result.stdout.splitlines()
    assert json.loads(line)["message_id"] == "m-0"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--follow", "--bits"], "--follow follows rows"),
        (["--follow", "--format", "json"], "--format jsonl"),
        (["verify", "--expect-head", "12"], "'12' is not a head"),
        (["verify", "--key", "nokey"], "nokey"),
    ],
)
async def test_audit_chain_mistakes_are_one_line(tmp_path, args, named):
    """A bad --follow combination, head or key is one `bcpbus: error:` line, exit 2."""
    await write_rows(tmp_path / "bcpbus.db", "send_start")
    result = run("audit", *args, cwd=tmp_path)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("bcpbus: error: ") and named in line, line


async def test_heads_on_stdout_come_after_the_listening_line(tmp_path):
    """`--audit-head -` keeps `listening on` the first line of stdout (`serving` checks it)."""
    async with serving(tmp_path, "--no-gateway", "--audit-head", "-", "--audit-head-rows", "1"):
        pass


async def test_keygen_serve_and_verify_with_nothing_but_the_public_key(tmp_path):
    """`audit keygen` makes the key pair, `serve --signing-key` signs checkpoints into
    bcpbus.db.checkpoints (0600), and `audit verify --pubkey` checks them: no secret needed."""
    made = run(
        "audit", "keygen", "--out", "keys/signing.key", "--name", "t.example/bcpbus", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert "public key: keys/signing.key.pub: t.example/bcpbus+" in made.stdout
    async with serving(tmp_path, "--no-gateway", "--signing-key", "keys/signing.key"):
        pass
    checkpoints = tmp_path / "bcpbus.db.checkpoints"
    assert stat.S_IMODE(checkpoints.stat().st_mode) == 0o600
    checked = run("audit", "verify", "--pubkey", "keys/signing.key.pub", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout
    assert "checkpoints verify, the last at row" in checked.stdout
    again = run("audit", "keygen", "--out", "keys/signing.key", cwd=tmp_path)
    assert again.returncode == 2 and "never overwritten" in again.stderr


async def test_a_lost_pub_is_made_again_from_the_signing_key(tmp_path):
    """Without the key's .pub, serve's summary points at `audit pubkey KEY`, which prints the
    verifier key keygen wrote, byte for byte; `verify --pubkey` takes what it printed; a key
    others can read is refused, not read."""
    assert run("audit", "keygen", "--out", "signing.key", cwd=tmp_path).returncode == 0
    lost = tmp_path / "signing.key.pub"
    original = lost.read_text()
    lost.unlink()
    async with serving_process(tmp_path, "--no-gateway", "--signing-key", "signing.key") as (
        _,
        process,
    ):
        summary = await stderr_line(process, "bcpbus: checkpoints: ")
    assert summary.endswith("its public key (`bcpbus audit pubkey signing.key` prints it)")
    derived = run("audit", "pubkey", "signing.key", cwd=tmp_path)
    assert derived.returncode == 0, derived.stderr
    assert derived.stdout == original
    lost.write_text(derived.stdout)
    checked = run("audit", "verify", "--pubkey", "signing.key.pub", cwd=tmp_path)
    assert checked.returncode == 0 and "checkpoints verify" in checked.stdout, checked.stdout
    (tmp_path / "signing.key").chmod(0o640)
    exposed = run("audit", "pubkey", "signing.key", cwd=tmp_path)
    assert exposed.returncode == 2 and exposed.stdout == ""
    assert exposed.stderr.startswith("bcpbus: error: signing key signing.key may be read by")


def last_signed(checkpoints: Path) -> int:
    """The latest row a checkpoint in the file signs; 0 for none."""
    text = checkpoints.read_text() if checkpoints.exists() else ""
    return max((Checkpoint.from_text(note.text).size for note in read_notes(text)), default=0)


async def signed_up_to(checkpoints: Path, row: int) -> None:
    """Wait until ``checkpoints`` holds a checkpoint of ``row`` or a later one."""
    async with asyncio.timeout(scaled(30)):
        while True:
            if last_signed(checkpoints) >= row:
                return
            await asyncio.sleep(0.05)  # another process appends it: nothing to wait on here


async def test_rows_other_commands_write_are_signed_while_the_bus_is_idle(tmp_path):
    """`budget reset` writes to a running bus's log without a key: the bus's next timed
    checkpoint signs its row though the bus writes none meanwhile, so verify --pubkey leaves
    no row unsigned."""
    assert run("audit", "keygen", "--out", "keys/signing.key", cwd=tmp_path).returncode == 0
    shutil.copytree(AGENTS, tmp_path / "agents")
    every = str(scaled(0.2))
    async with serving(
        tmp_path, "--no-gateway", "--signing-key", "keys/signing.key", "--audit-head-seconds", every
    ):
        reset = run("budget", "reset", "main", "researcher", cwd=tmp_path)
        assert reset.returncode == 0, reset.stderr
        [row] = json.loads(
            run("audit", "--event", "bcp_budget_reset", "--json", cwd=tmp_path).stdout
        )
        await signed_up_to(tmp_path / "bcpbus.db.checkpoints", row["id"])
        checked = run("audit", "verify", "--pubkey", "keys/signing.key.pub", cwd=tmp_path)
        assert checked.returncode == 0, checked.stdout
        assert f"the last at row {row['id']}" in checked.stdout
        assert "note:" not in checked.stdout


async def test_serve_refuses_a_signing_key_others_can_read_in_one_line(tmp_path):
    """A signing key with group or other permissions stops `serve` before it listens."""
    assert run("audit", "keygen", "--out", "signing.key", cwd=tmp_path).returncode == 0
    (tmp_path / "signing.key").chmod(0o644)
    refused = run(
        "serve", "--port", "0", "--no-gateway", "--signing-key", "signing.key", cwd=tmp_path
    )
    assert refused.returncode == 2 and "listening" not in refused.stdout
    assert refused.stderr.splitlines()[-1].startswith("bcpbus: error: signing key signing.key")
    assert "chmod 600" in refused.stderr


async def test_serve_signs_by_default_with_a_key_in_the_config_directory(tmp_path, monkeypatch):
    """With no key given, `serve` makes one under $XDG_CONFIG_HOME/bcpbus (not beside the
    database) and signs with it; --no-checkpoints writes none."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    async with serving(tmp_path, "--no-gateway"):
        pass
    key = tmp_path / "config" / "bcpbus" / "signing.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    public = f"{key}.pub"
    assert run("audit", "verify", "--pubkey", public, cwd=tmp_path).returncode == 0
    other = tmp_path / "off"
    other.mkdir()
    async with serving(other, "--no-gateway", "--no-checkpoints"):
        pass
    assert not (other / "bcpbus.db.checkpoints").exists()
