"""The bcpbus command through real subprocesses: serve, peers, audit."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bus.core.errors import AuthenticationFailed
from bus.log.schema import SCHEMA
from peers import Peer
from peers.testing import Inbox, scaled

# The installed console script, from the same environment as the tests.
BCPBUS = [str(Path(sys.executable).with_name("bcpbus"))]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BCPBUS, *args], cwd=cwd, capture_output=True, text=True, timeout=scaled(60)
    )


@asynccontextmanager
async def serving(cwd: Path, *args: str) -> AsyncIterator[str]:
    """Start `bcpbus serve --port 0` in cwd; yield its URL; SIGTERM it on exit."""
    process = await asyncio.create_subprocess_exec(
        *BCPBUS,
        "serve",
        "--port",
        "0",
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            line = (await process.stdout.readline()).decode().strip()
        assert line.startswith("listening on ws://"), line
        yield line.removeprefix("listening on ")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            code = await process.wait()
        assert code == 0, (await process.stderr.read()).decode()  # type: ignore[union-attr]


def test_peers_add_prints_a_token_once_and_stores_only_its_hash(tmp_path):
    """`peers add` prints the token on stdout; the file holds a hash, never the token."""
    result = run("peers", "add", "agent:w1", "--role", "agent", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert len(token) >= 40
    stored = (tmp_path / "bcpbus-peers.yaml").read_text()
    assert token not in stored and "sha256:" in stored
    assert (tmp_path / "bcpbus-peers.yaml").stat().st_mode & 0o777 == 0o600
    listed = run("peers", "list", cwd=tmp_path)
    assert listed.stdout.strip() == "agent:w1\tagent"


def test_peers_add_refuses_an_unknown_role_and_a_bad_id(tmp_path):
    """An unknown role or a malformed clientId is an error with exit code 2."""
    assert run("peers", "add", "agent:w1", "--role", "wizard", cwd=tmp_path).returncode == 2
    bad = run("peers", "add", "agent:*", cwd=tmp_path)
    assert bad.returncode == 2 and "error" in bad.stderr


def test_peers_remove(tmp_path):
    """`peers remove` deletes a credential; removing it again fails, as `peers rotate` does."""
    run("peers", "add", "tg:1", cwd=tmp_path)
    assert run("peers", "remove", "tg:1", cwd=tmp_path).returncode == 0
    assert run("peers", "remove", "tg:1", cwd=tmp_path).returncode == 2


def test_broken_policy_stops_serve(tmp_path):
    """An empty policy file stops the bus at start with a clear error, never allows all."""
    (tmp_path / "policy.yaml").write_text("")
    result = run("serve", "--port", "0", "--policy", "policy.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "policy.yaml" in result.stderr


def test_bad_config_key_stops_serve(tmp_path):
    """A typo in the config file is an error naming the key."""
    (tmp_path / "bcpbus.yaml").write_text("limits:\n  max_frame_byte: 10\n")
    result = run("serve", "--config", "bcpbus.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "max_frame_byte" in result.stderr


def test_peers_add_checks_roles_against_the_policy_given(tmp_path):
    """`peers add --policy FILE` accepts that policy's roles and refuses the others."""
    (tmp_path / "policy.yaml").write_text("version: 1\nroles:\n  scribe: {}\n")
    assert run("peers", "add", "agent:w1", "--role", "scribe", cwd=tmp_path).returncode == 2
    added = run(
        "peers", "add", "agent:w1", "--role", "scribe", "--policy", "policy.yaml", cwd=tmp_path
    )
    assert added.returncode == 0, added.stderr
    refused = run(
        "peers", "add", "agent:w2", "--role", "agent", "--policy", "policy.yaml", cwd=tmp_path
    )
    assert refused.returncode == 2 and "agent" in refused.stderr


def test_bad_gateway_config_key_stops_serve(tmp_path):
    """A typo in the config file's gateway section is an error naming the file and the key."""
    (tmp_path / "bcpbus.yaml").write_text("gateway:\n  query_tl: 10\n")
    result = run("serve", "--config", "bcpbus.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "bcpbus.yaml: gateway.query_tl: unknown key" in result.stderr


def test_a_command_that_fails_to_import_fails_loudly(tmp_path):
    """A broken import in the gateway stops `bcpbus` with the error, not a bus without gateway."""
    broken = (
        "import sys; sys.modules['peers.gateway.runner'] = None; "
        "from peers.cli import main; sys.exit(main(['serve', '--port', '0']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", broken], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "listening" not in result.stdout
    # ModuleNotFoundError is the ImportError that a module set to None in sys.modules raises.
    assert "ModuleNotFoundError" in result.stderr and "peers.gateway.runner" in result.stderr


def test_the_bus_imports_no_peer():
    """The bus's command line and server load without importing anything from `peers`."""
    probe = (
        "import sys, bus.cli, bus.server; print([m for m in sys.modules if m.startswith('peers')])"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_audit_of_a_missing_db_is_a_clear_error(tmp_path):
    """`audit` on a missing file says which file."""
    result = run("audit", "--db", "nope.db", cwd=tmp_path)
    assert result.returncode == 2 and "nope.db" in result.stderr


def _audit_log(path: Path) -> Path:
    """An empty activity log at ``path``, as the bus creates it."""
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA)
    db.close()
    return path


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--limit", "99999999999999999999"], "--limit 99999999999999999999"),
        (["--limit", "-1"], "--limit -1"),
        (["--db", "notes.txt"], "notes.txt is not an SQLite database"),
        (["--db", "notes.txt", "--bits"], "notes.txt is not an SQLite database"),
        (["--db", "notes.txt", "--refusals"], "notes.txt is not an SQLite database"),
        (["--db", "notes.txt", "--query", "q-1"], "notes.txt is not an SQLite database"),
        (["--db", "missing.db"], "--db missing.db does not exist"),
        (["--db", "."], "--db . is a directory"),
        (["--since", "last tuesday"], "since: 'last tuesday'"),
        (["--until", "2026-13-01"], "until: '2026-13-01'"),
        (["--until", "9999-12-31T23:00:00-05:00"], "until: '9999-12-31T23:00:00-05:00'"),
        (["--topic", "agent::x"], "invalid pattern 'agent::x'"),
    ],
)
def test_audit_mistakes_are_one_line_not_a_traceback(tmp_path, args, named):
    """A bad --limit, --db, --since or --until is one `bcpbus: error:` line naming it, exit 2."""
    _audit_log(tmp_path / "bcpbus.db")
    (tmp_path / "notes.txt").write_text("not a database\n" * 200)
    result = run("audit", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("bcpbus: error: ") and named in line, line


def test_audit_limit_zero_and_the_largest_limit_work(tmp_path):
    """--limit 0 and --limit 9223372036854775807 (SQLite's largest integer) are answered."""
    _audit_log(tmp_path / "bcpbus.db")
    for limit in ("0", "9223372036854775807"):
        result = run("audit", "--limit", limit, "--json", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == []


async def test_serve_two_peers_and_audit(tmp_path):
    """The quickstart: serve, two peers exchange a message, audit shows its rows."""
    w1 = run("peers", "add", "agent:w1", cwd=tmp_path).stdout.strip()
    tg = run("peers", "add", "tg:7", cwd=tmp_path).stdout.strip()
    async with serving(tmp_path, "--no-gateway") as url:
        inbox = Inbox()
        async with Peer(url, "agent:w1", w1) as agent, Peer(url, "tg:7", tg) as chat:
            agent.handle(None, inbox)
            await agent.subscribe("agent:w1")
            result = await chat.send("agent:w1", "tg_message", {"text": "hi"}, message_id="cli-1")
            assert result.delivered_to == 1
        with pytest.raises(AuthenticationFailed):
            await Peer(url, "agent:w1", "not-the-token", reconnect=False).connect()
    # After SIGTERM the log is flushed; audit reads it back.
    rows = json.loads(run("audit", "--message-id", "cli-1", "--json", cwd=tmp_path).stdout)
    assert [row["event"] for row in rows] == [
        "send_start",
        "process_start",
        "process_finish",
        "send_finish",
    ]
    table = run("audit", "--topic", "agent:*", "--event", "send_finish", cwd=tmp_path).stdout
    assert "cli-1" in table
    refused = json.loads(run("audit", "--event", "ws_refused", "--json", cwd=tmp_path).stdout)
    assert [row["payload"]["reasons"] for row in refused] == [{"wrong_token": 1}]


async def test_serve_answers_healthz_and_flushes_on_sigterm(tmp_path):
    """SIGTERM exits 0 and the shutdown row is in the log."""
    async with serving(tmp_path, "--no-gateway") as url:
        host_port = url.removeprefix("ws://")
        reader, writer = await asyncio.open_connection(*host_port.rsplit(":", 1))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        async with asyncio.timeout(scaled(10)):
            status = await reader.readline()
        writer.close()
        assert b"200" in status
    rows = json.loads(run("audit", "--event", "shutdown", "--json", cwd=tmp_path).stdout)
    assert len(rows) == 1


async def test_kill_9_keeps_every_answered_message(tmp_path):
    """After kill -9, every message whose sendMessage was answered has all four rows."""
    w1 = run("peers", "add", "agent:w1", cwd=tmp_path).stdout.strip()
    tg = run("peers", "add", "tg:7", cwd=tmp_path).stdout.strip()
    process = await asyncio.create_subprocess_exec(
        *BCPBUS,
        "serve",
        "--port",
        "0",
        "--no-gateway",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    answered: list[str] = []
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            url = (await process.stdout.readline()).decode().strip().removeprefix("listening on ")
        agent = Peer(url, "agent:w1", w1, reconnect=False)
        chat = Peer(url, "tg:7", tg, reconnect=False)
        agent.handle(None, Inbox())
        await agent.connect()
        await chat.connect()

        async def send(n: int) -> None:
            result = await chat.send("agent:w1", "tg_message", {"n": n}, message_id=f"k-{n}")
            answered.append(result.message_id)

        # Concurrent senders, so the kill lands while some are in flight.
        async with asyncio.timeout(scaled(30)):
            await asyncio.gather(*(send(n) for n in range(200)))
            tasks = [asyncio.create_task(send(n)) for n in range(200, 400)]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            process.kill()
            # Those in flight fail with the connection; only the answered ones count.
            await asyncio.gather(*tasks, return_exceptions=True)
        await agent.close()
        await chat.close()
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
    assert len(answered) >= 201
    with sqlite3.connect(tmp_path / "bcpbus.db") as db:
        rows = db.execute(
            "SELECT message_id, group_concat(event) FROM activity_log "
            "WHERE message_id LIKE 'k-%' GROUP BY message_id"
        ).fetchall()
    events = {message_id: set(kinds.split(",")) for message_id, kinds in rows}
    for message_id in answered:
        assert events.get(message_id) == {
            "send_start",
            "process_start",
            "process_finish",
            "send_finish",
        }, message_id
    # What was committed chains intact, and the bus starts again on it (its tail check passes).
    verified = run("audit", "verify", cwd=tmp_path)
    assert verified.returncode == 0 and verified.stdout.startswith("ok: "), verified.stdout
    async with serving(tmp_path, "--no-gateway"):
        pass
    assert run("audit", "verify", cwd=tmp_path).returncode == 0


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_serve_runs_on_the_loop_asked_for(monkeypatch):
    """--loop asyncio is asyncio even with uvloop installed; --loop uvloop without uvloop is a
    clear error, not a silent fallback; auto falls back to asyncio."""
    from bus.cli import _run
    from bus.ops.startup import StartupError

    assert _run(_loop_module(), "asyncio").startswith("asyncio")  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    with pytest.raises(StartupError, match=r"pip install 'bcpbus\[speed\]'"):
        _run(_loop_module(), "uvloop")  # type: ignore[arg-type]
    assert _run(_loop_module(), "auto").startswith("asyncio")  # type: ignore[arg-type]


def test_serve_loop_flag_is_checked(tmp_path):
    result = run("serve", "--loop", "trio", cwd=tmp_path)
    assert result.returncode == 2 and "invalid choice: 'trio'" in result.stderr
