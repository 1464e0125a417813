"""`bcpbus approve` through real subprocesses: list and show from the database, decisions and
watch through a real bus with a stand-in gateway peer."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from peers.approver import Approver
from peers.testing import BusHarness, running_bcp, running_bus, scaled
from tests.peers.test_approver import (
    HOSTILE,
    FakeGateway,
    approval_row,
    make_approvals_db,
    request_content,
)

# The installed console script, from the same environment as the tests.
BCPBUS = [str(Path(sys.executable).with_name("bcpbus"))]
DOCS = Path(__file__).resolve().parents[2] / "docs"
ENV = {key: value for key, value in os.environ.items() if key != "BCPBUS_TOKEN"}


def _digits_as_zero(path: Path) -> str:
    return re.sub(r"\d", "0", path.read_text(encoding="utf-8"))


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BCPBUS, *args], cwd=cwd, capture_output=True, text=True, timeout=scaled(60), env=ENV
    )


async def arun(*args: str, cwd: Path, **env: str) -> tuple[int, str, str]:
    """Run bcpbus without blocking the event loop the in-process bus runs on."""
    process = await asyncio.create_subprocess_exec(
        *BCPBUS,
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**ENV, **env},
    )
    async with asyncio.timeout(scaled(60)):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def test_list_shows_open_approvals_as_a_table_or_json(tmp_path):
    """`list` shows pending, unexpired approvals; `--all` every one; `--json` the rows."""
    make_approvals_db(
        tmp_path / "bcpbus.db",
        [
            approval_row("a1"),
            approval_row("a2", "approved", decided_by="human:bob"),
            approval_row("a3", expires_ts="2020-01-01T00:00:00Z"),
        ],
    )
    table = run("approve", "list", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["approval_id", "status", "kind"]
    assert [line.split()[0] for line in lines[2:]] == ["a1"]
    assert "main <- researcher" in table.stdout and "q-a1" in table.stdout
    every = run("approve", "list", "--all", "--json", cwd=tmp_path)
    rows = json.loads(every.stdout)
    assert [(row["approval_id"], row["status"]) for row in rows] == [
        ("a1", "pending"),
        ("a2", "approved"),
        ("a3", "pending"),
    ]
    assert rows[0]["request"]["reader"] == "researcher" and rows[1]["decided_by"] == "human:bob"
    late = run("approve", "show", "a3", cwd=tmp_path)
    assert "past its expiry: the gateway counts it as rejected" in late.stdout


def test_list_with_no_table_or_no_database(tmp_path):
    """No table yet means no approvals (exit 0); no database file is an error naming it (2)."""
    (tmp_path / "bcpbus.db").touch()
    empty = run("approve", "list", cwd=tmp_path)
    assert empty.returncode == 0 and empty.stdout.strip() == "no pending approvals"
    assert run("approve", "list", "--all", cwd=tmp_path).stdout.strip() == "no approvals"
    assert json.loads(run("approve", "list", "--json", cwd=tmp_path).stdout) == []
    missing = run("approve", "--db", "nope.db", "list", cwd=tmp_path)
    assert missing.returncode == 2 and "nope.db" in missing.stderr


def test_list_and_show_find_the_database_of_the_bcpbus_init_layout(tmp_path):
    """`--config` reads the db from the file `serve --config` reads, as `bcpbus init` writes it;
    without it, a missing ./bcpbus.db says to give --db or --config (exit 2)."""
    assert run("init", "site", cwd=tmp_path).returncode == 0
    make_approvals_db(tmp_path / "site" / "bcpbus.db", [approval_row("a1")])
    listed = run("approve", "--config", "site/bcpbus.yaml", "list", cwd=tmp_path)
    assert listed.returncode == 0 and "a1" in listed.stdout, listed.stderr
    shown = run("approve", "show", "a1", "--config", "site/bcpbus.yaml", cwd=tmp_path)
    assert shown.returncode == 0 and "status: pending" in shown.stdout, shown.stderr
    missing = run("approve", "list", cwd=tmp_path)
    assert missing.returncode == 2 and "--config" in missing.stderr, missing.stderr
    both = run("approve", "--db", "x.db", "--config", "site/bcpbus.yaml", "list", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with" in both.stderr, both.stderr
    bad = run("approve", "--config", "nope.yaml", "list", cwd=tmp_path)
    assert bad.returncode == 2 and "nope.yaml" in bad.stderr, bad.stderr


def test_show_renders_the_request_with_terminal_controls_escaped(tmp_path):
    """`show ID` labels the text untrusted and never writes a raw control character."""
    hostile = approval_row(
        "a1", request_json=json.dumps(request_content("a1", response={"summary": HOSTILE}))
    )
    decision = {"approval_id": "a2", "decision": "reject", "reason": "vague \x1b[8m"}
    decided = approval_row(
        "a2",
        "rejected",
        decided_by="human:bob",
        decided_ts="2026-01-01T00:01:00Z",
        decision_json=json.dumps(decision),
    )
    make_approvals_db(tmp_path / "approvals.db", [hostile, decided])
    shown = run("approve", "show", "a1", "--db", "approvals.db", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "UNTRUSTED CONTENT" in shown.stdout and "BEGIN UNTRUSTED TEXT" in shown.stdout
    assert "\\x1b[2J" in shown.stdout and "\\u202e" in shown.stdout
    assert all(line.isprintable() for line in shown.stdout.splitlines())
    assert "status: pending" in shown.stdout
    other = run("approve", "show", "a2", "--db", "approvals.db", cwd=tmp_path).stdout
    assert "status: rejected" in other and "decided by human:bob" in other
    assert "reason: vague \\x1b[8m" in other
    as_json = json.loads(
        run("approve", "show", "a2", "--json", "--db", "approvals.db", cwd=tmp_path).stdout
    )
    assert as_json["decision"] == decision
    missing = run("approve", "show", "zz", "--db", "approvals.db", cwd=tmp_path)
    assert missing.returncode == 1 and "no approval zz" in missing.stderr


async def test_approve_reject_and_edit_reach_the_gateway(tmp_path):
    """Each decision action sends through the bus as the approver and exits 0 when taken."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g:
            gateway = await FakeGateway(g).start()
            for approval_id in ("a1", "a2", "a3"):
                await gateway.request(approval_id)
            token = h.token("human:alice")
            (tmp_path / "alice.token").write_text(token + "\n")
            alice = f"approve --url {h.url} --as human:alice".split()

            code, out, err = await arun(*alice, "--token", token, "approve", "a1", cwd=tmp_path)
            assert code == 0, err
            assert out.strip() == "approved a1: the gateway took the decision"
            # Options after the action, and the token from a file.
            code, out, err = await arun(
                "approve", "reject", "a2", "--reason", "off topic", *alice[1:],
                "--token-file", "alice.token", cwd=tmp_path,
            )  # fmt: skip
            assert code == 0, err
            # A bare name means human:NAME; the token from the environment.
            code, out, err = await arun(
                "approve", "--url", h.url, "--as", "alice", "edit", "a3",
                "--response-json", '{"summary": "Shorter."}', cwd=tmp_path, BCPBUS_TOKEN=token,
            )  # fmt: skip
            assert code == 0, err

            got = [await gateway.decisions.get() for _ in range(3)]
            assert {m.sender for m in got} == {"human:alice"}
            assert [m.content for m in got] == [
                {"approval_id": "a1", "decision": "approve"},
                {"approval_id": "a2", "decision": "reject", "reason": "off topic"},
                {
                    "approval_id": "a3",
                    "decision": "edit",
                    "edited_response": {"summary": "Shorter."},
                },
            ]


async def test_a_refused_decision_exits_1_with_the_gateway_reason(tmp_path):
    """A decision the gateway does not take exits 1 and says why when the log is at hand."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g:
            await FakeGateway(g).start()
            token = h.token("human:alice")
            args = ["approve", "--url", h.url, "--as", "human:alice", "--token", token]
            code, out, err = await arun(*args, "--db", str(h.db), "approve", "gone", cwd=tmp_path)
            assert (code, out) == (1, ""), err
            assert "did not take the decision on gone" in err and "unknown_approval" in err
            # Without the log, the refusal is still reported.
            code, _, err = await arun(*args, "--db", "none.db", "reject", "gone", cwd=tmp_path)
            assert code == 1 and "did not take the decision" in err, err


async def test_a_decision_on_a_decided_approval_says_it_was_already_decided(tmp_path):
    """With the real gateway, `reject` of an approval someone approved first exits 1 and says
    who decided it and when (already_decided); a typo stays unknown_approval."""
    summary = {"category": 3, "directive": "Summarize the document.", "max_words": 40}
    async with running_bcp(tmp_path) as h:
        async with (
            h.controller("main") as main,
            h.reader("researcher") as reader,
            Approver(h.bus.peer("human:bob")) as bob,
        ):

            async def answer(query: dict[str, object]) -> dict[str, str]:
                return {"summary": "Quiet text."}

            reader.on_query(answer)
            asked = asyncio.create_task(main.ask("researcher", summary, timeout=scaled(10)))
            async with asyncio.timeout(scaled(10)):
                request = await bob.next_request()
            assert await bob.approve(request.approval_id)
            await asked
        args = ["approve", "--url", h.bus.url, "--as", "alice", "--db", str(h.bus.db)]
        token = h.bus.token("human:alice")
        code, out, err = await arun(
            *args, "reject", request.approval_id, cwd=tmp_path, BCPBUS_TOKEN=token
        )
        assert (code, out) == (1, ""), err
        assert (
            f"approval {request.approval_id} was already decided: approved by human:bob at" in err
        )
        assert "the gateway did not take this decision (already_decided)" in err
        # docs/approvals.md prints this very line, with its own id and time.
        shown = err.strip().replace(request.approval_id, "ap-1f2e3d4c5b6a")
        assert re.sub(r"\d", "0", f"# {shown}") in _digits_as_zero(DOCS / "approvals.md"), err
        code, _, err = await arun(*args, "approve", "ap-typo", cwd=tmp_path, BCPBUS_TOKEN=token)
        assert code == 1 and "unknown_approval" in err and "already" not in err, err


async def test_usage_and_connection_errors_exit_2(tmp_path):
    """No approver, no token, bad JSON, a wrong token, a non-approver or no bus: exit 2."""
    async with running_bus(tmp_path) as h:
        token = h.token("human:alice")
        agent = h.token("agent:main")
        alice = f"approve --url {h.url} --as human:alice"
        cases = [
            (f"approve --url {h.url} --token {token} approve a1", "--as human:NAME is required"),
            (f"{alice} approve a1", "--token-file FILE"),
            (f"{alice} --token {token} edit a1 --response-json {{nope", "not JSON"),
            (f"{alice} --token {token} edit a1 --response-json [1]", "must be a JSON object"),
            (f"{alice} --token wrong approve a1", "refused"),
            (f"approve --url {h.url} --as agent:main --token {agent} approve a1", "may not send"),
            (f"{alice} --token-file nope.token approve a1", "nope.token"),
            (
                f"approve --url ws://127.0.0.1:9 --as human:alice --token {token} watch",
                "cannot reach the bus at ws://127.0.0.1:9",
            ),
        ]
        for args, message in cases:
            code, _, err = await arun(*args.split(), cwd=tmp_path)
            assert (code, message in err) == (2, True), (args, err)


@asynccontextmanager
async def watching(h: BusHarness, cwd: Path, *args: str) -> AsyncIterator[Watch]:
    """Run `bcpbus approve watch ARGS` as human:alice on the harness's bus; kill it on exit."""
    process = await asyncio.create_subprocess_exec(
        *BCPBUS, "approve", "--url", h.url, "--as", "human:alice", "watch", *args,
        cwd=cwd,
        env={**ENV, "BCPBUS_TOKEN": h.token("human:alice"), "PYTHONUNBUFFERED": "1"},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield Watch(process)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


class Watch:
    """A running `watch`: type lines into it, read its output until a text shows up."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.seen: list[str] = []

    def type(self, line: str) -> None:
        self.stdin.write(line.encode() + b"\n")

    async def expect(self, text: str) -> str:
        """Read lines until one contains ``text``; return that line."""
        async with asyncio.timeout(scaled(20)):
            while True:
                line = (await self.stdout.readline()).decode()
                assert line, f"end of output before {text!r}: {''.join(self.seen)}"
                self.seen.append(line)
                if text in line:
                    return line

    async def exit_code(self) -> int:
        async with asyncio.timeout(scaled(20)):
            return await self.process.wait()


async def test_watch_shows_each_request_and_sends_the_answer(tmp_path):
    """`watch` renders a request safely, asks, sends reject and edit, and exits at end of input."""
    async with running_bus(tmp_path) as h, h.peer("system:gateway") as g:
        gateway = await FakeGateway(g).start()
        async with watching(h, tmp_path) as watch:
            await watch.expect("watching system:approval as human:alice")
            watch.type("a")  # no request on screen: not taken as an answer
            await watch.expect("no request is waiting")

            await gateway.request("appr-1", response={"summary": HOSTILE})
            await watch.expect("[a]pprove / [r]eject / [e]dit / [s]kip")
            shown = "".join(watch.seen)
            assert "UNTRUSTED CONTENT" in shown and "\\x1b[2J" in shown
            assert "\x1b" not in shown and "\u202e" not in shown
            watch.type("what?")
            await watch.expect("please answer a, r, e or s")
            watch.type("r")
            await watch.expect("reason")
            watch.type("too vague")
            await watch.expect("rejected appr-1: the gateway took")

            await gateway.request("appr-2")
            await watch.expect("[a]pprove")
            watch.type("e")
            await watch.expect("plain text for the summary")
            watch.type("A plain summary.")
            await watch.expect("edited appr-2: the gateway took")

            await gateway.request("appr-3")
            await watch.expect("[a]pprove")
            watch.type("s")
            await watch.expect("skipped appr-3")
            watch.stdin.close()
            assert await watch.exit_code() == 0
        got = [await gateway.decisions.get() for _ in range(2)]
        edited = {"summary": "A plain summary."}
        assert [m.content for m in got] == [
            {"approval_id": "appr-1", "decision": "reject", "reason": "too vague"},
            {"approval_id": "appr-2", "decision": "edit", "edited_response": edited},
        ]
        assert got[0].sender == "human:alice" and gateway.open == {"appr-3"}


async def test_watch_yes_approves_everything_until_interrupted(tmp_path):
    """`watch --yes` approves each request as it arrives and exits 0 on SIGINT."""
    async with running_bus(tmp_path) as h, h.peer("system:gateway") as g:
        gateway = await FakeGateway(g).start()
        async with watching(h, tmp_path, "--yes") as watch:
            await watch.expect("approving everything")
            for approval_id in ("y1", "y2"):
                await gateway.request(approval_id)
                await watch.expect(f"approved {approval_id}")
            watch.process.send_signal(signal.SIGINT)
            assert await watch.exit_code() == 0
        decisions = [(await gateway.decisions.get()).content for _ in range(2)]
        assert decisions == [
            {"approval_id": "y1", "decision": "approve"},
            {"approval_id": "y2", "decision": "approve"},
        ]
