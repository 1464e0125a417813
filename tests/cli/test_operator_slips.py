"""Slips a new operator makes in the first hour, each through a real `bcpbus` process: what it
says, what it leaves behind and how it exits."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from peers.testing import running_bus, scaled
from tests.cli.test_cli import serving
from tests.cli.test_operators import BCPBUS, arun, assert_one_line_error, run

ROOT = Path(__file__).parents[2]


def test_budget_reset_outside_the_log_s_folder_creates_nothing(tmp_path):
    """`budget reset` with no log at --db exits non-zero naming the path and --db, and leaves
    no empty bcpbus.db behind."""
    result = run("budget", "reset", "main", "researcher", cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, "--db bcpbus.db does not exist")
    assert not (tmp_path / "bcpbus.db").exists()
    assert "applies it" not in result.stdout
    (tmp_path / "logs").mkdir()
    result = run("budget", "reset", "main", "researcher", "--db", "logs", cwd=tmp_path)
    assert_one_line_error(result.returncode, result.stderr, "--db logs is a directory")


def test_an_http_port_in_use_is_named_as_the_http_port(tmp_path):
    """serve with --http-port on a port another socket holds: the line names --http-port,
    not the WebSocket --port, and the bus does not stay up."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("serve", "--port", "0", "--http-port", str(port), "--no-gateway", cwd=tmp_path)
    last = assert_one_line_error(result.returncode, result.stderr, f"--http-port {port}")
    assert "already listens" in last and "--http-port 0" in last
    assert " --port " not in last


def test_http_port_without_the_http_extra_is_one_line(tmp_path):
    """Without the http extra (starlette blocked from importing), `serve --http-port` says
    how to install it, in one line, before anything listens or opens the log."""
    script = (
        "import sys; sys.modules['starlette'] = None\n"  # None in sys.modules: ImportError
        "from peers.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, "serve", "--port", "0", "--http-port", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    last = assert_one_line_error(result.returncode, result.stderr, "--http-port 0")
    assert "pip install 'bcpbus[http]'" in last and "starlette" in last
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stdout == "" and not (tmp_path / "bcpbus.db").exists()


def test_peers_remove_and_rotate_of_an_unknown_id_agree(tmp_path):
    """`peers remove` and `peers rotate` of a clientId with no token exit with the same code,
    each with one line naming it; rotate points at `peers add`."""
    assert run("peers", "add", "agent:w1", cwd=tmp_path).returncode == 0
    removed = run("peers", "remove", "agent:nobody", cwd=tmp_path)
    rotated = run("peers", "rotate", "agent:nobody", cwd=tmp_path)
    assert_one_line_error(removed.returncode, removed.stderr, "agent:nobody has no token")
    last = assert_one_line_error(rotated.returncode, rotated.stderr, "agent:nobody has no token")
    assert "bcpbus peers add agent:nobody" in last
    assert removed.returncode == rotated.returncode


def test_audit_into_a_closed_pipe_ends_quietly(tmp_path):
    """`bcpbus audit --format jsonl | head`: when the reader has gone, no "Broken pipe" error
    and no traceback, and the exit code is SIGPIPE's."""

    async def make_log() -> None:
        async with running_bus(tmp_path) as h, h.peer("agent:w1") as peer:
            await peer.send("agent:w1", "agent_event", {"n": 1})

    asyncio.run(make_log())
    process = subprocess.Popen(
        [BCPBUS, "audit", "--db", "activity.db", "--format", "jsonl"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader is gone before the first row is written
    with process.stderr:
        err = process.stderr.read().decode()
    assert process.wait(timeout=scaled(60)) == 141, err
    assert err == ""
    shell = subprocess.run(
        [
            "bash",
            "-c",
            f"set -o pipefail; {BCPBUS} audit --db activity.db --format jsonl | head -1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert shell.stderr == "" and json.loads(shell.stdout)["event"]


async def test_an_unknown_client_id_is_pointed_at_peers_add(tmp_path):
    """A clientId the bus does not know gets a line suggesting `peers add`, not `peers
    rotate` (which would fail for it)."""
    async with running_bus(tmp_path) as h:
        code, _, err = await arun(
            "sub",
            "agent:*",
            "--url",
            h.url,
            "--as",
            "agent:ghost",
            "--token",
            "bcpbus_x",
            cwd=tmp_path,
        )
    last = assert_one_line_error(code, err, "refused agent:ghost's token")
    assert "bcpbus peers add agent:ghost" in last and "rotate" not in last


async def test_what_the_docs_leave_in_a_working_copy_is_ignored(tmp_path, monkeypatch):
    """Run from a git working copy as docs/bootstrap.md and docs/audit.md do, `peers add`,
    `audit keygen` and `serve` leave tokens, keys, the log and its checkpoints there: the
    repository's .gitignore covers each, so `git status` shows none of them."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the default signing key
    work = tmp_path / "work"
    (work / "agent-tokens").mkdir(parents=True)
    git("init", "-q", cwd=work)
    shutil.copy(ROOT / ".gitignore", work)
    for client_id, path in [
        ("agent:system", "system.token"),
        ("agent:echo", "agent-tokens/echo.token"),
        ("tg:42", "tg42.token"),
    ]:
        made = run("peers", "add", client_id, cwd=work)
        assert made.returncode == 0, made.stderr
        (work / path).write_text(made.stdout)
    assert run("audit", "keygen", "--out", "keys/signing.key", cwd=work).returncode == 0
    async with serving(work, "--signing-key", "keys/signing.key"):
        pass
    left = {
        path.relative_to(work).as_posix() for path in work.rglob("*") if ".git" not in path.parts
    }
    assert {"bcpbus.db", "bcpbus.db.checkpoints", "tg42.token", "keys/signing.key.pub"} <= left
    status = git("status", "--porcelain", "--untracked-files=all", cwd=work)
    assert status.splitlines() == ["?? .gitignore"]


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=scaled(30)
    )
    return done.stdout
