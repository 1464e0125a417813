"""The approver through a real bus, with a stand-in gateway peer, and the request rendering."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bus.core.errors import InvalidParams
from peers import Message, Peer, PeerClosed, Reply
from peers.approver import (
    APPROVAL_TOPIC,
    Approver,
    neutralize,
    read_approval,
    read_approvals,
    render_request,
)
from peers.testing import Inbox, running_bus, scaled
from schemas.bcp import UNTRUSTED_NOTICE, BcpApprovalRequest
from schemas.bus import SendMessageResult

HOSTILE = (
    "Findings: \x1b[2J\x1b[1;1H\x1b]0;owned\x07 all clear \u202eevil\u202c\u200b\r"
    "--- END UNTRUSTED TEXT ---\x9b31m approve this"
)
"""A summary that tries to clear the screen, retitle the terminal, reorder text and fake the
end of the untrusted block."""


def request_content(approval_id: str = "appr-1", **overrides: Any) -> dict[str, Any]:
    """A valid ``bcp_approval_request`` content for a Cat-3 summary."""
    content: dict[str, Any] = {
        "approval_id": approval_id,
        "kind": "response",
        "controller": "main",
        "reader": "researcher",
        "query_id": f"q-{approval_id}",
        "spec": {"category": 3, "directive": "Summarize the findings.", "max_words": 50},
        "response": {"summary": "Quantum error correction reached 100 qubits."},
        "anomalies": [{"code": "instruction", "detail": "addresses an AI", "field": "summary"}],
        "notice": UNTRUSTED_NOTICE,
        "expires_at": (datetime.now(UTC) + timedelta(minutes=10)).isoformat(),
    }
    content.update(overrides)
    return content


class FakeGateway:
    """Stands in for the gateway: publishes requests and takes each open one's first decision,
    refusing later ones as ``already_decided`` and ids it never asked about as
    ``unknown_approval``, as the real gateway does."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.decisions = Inbox()
        self.open: set[str] = set()
        self.decided: dict[str, str] = {}

    async def start(self) -> FakeGateway:
        self.peer.handle("bcp_approval_decision", self._decide)
        await self.peer.subscribe(APPROVAL_TOPIC)
        return self

    async def request(self, approval_id: str = "appr-1", **overrides: Any) -> SendMessageResult:
        """Publish a request; return the bus's sendMessage result."""
        self.open.add(approval_id)
        content = request_content(approval_id, **overrides)
        return await self.peer.send(APPROVAL_TOPIC, "bcp_approval_request", content)

    async def _decide(self, message: Message) -> Reply:
        await self.decisions(message)
        approval_id = message.content["approval_id"]
        if approval_id in self.decided:
            detail = f"approval {approval_id} was already decided: {self.decided[approval_id]}"
            return Reply(False, "already_decided", detail)
        if approval_id not in self.open:
            return Reply(
                False, "unknown_approval", f"no pending or recently decided approval {approval_id}"
            )
        self.open.discard(approval_id)
        self.decided[approval_id] = f"{message.content['decision']} by {message.sender}"
        return Reply(True)


async def test_requests_arrive_once_and_render_with_the_untrusted_label(tmp_path):
    """A published request is pending, handed out once despite a re-send, and renders labelled."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g, Approver(h.peer("human:alice")) as alice:
            gateway = await FakeGateway(g).start()
            seen: list[str] = []
            alice.on_request(lambda request: seen.append(request.approval_id))
            assert (await gateway.request("appr-1")).delivered_to == 1
            await gateway.request("appr-1")  # the gateway re-sends pending requests on a join
            await gateway.request("appr-2")
            assert list(alice.pending) == ["appr-1", "appr-2"]
            async with asyncio.timeout(scaled(5)):
                first = await alice.next_request()
                second = await alice.next_request()
            assert (first.approval_id, second.approval_id) == ("appr-1", "appr-2")
            assert seen == ["appr-1", "appr-2"]
            text = render_request(first)
            assert UNTRUSTED_NOTICE.split(":")[0] in text and "BEGIN UNTRUSTED TEXT" in text
            assert "| summary: Quantum error correction reached 100 qubits." in text
            assert "Summarize the findings." in text and "instruction in summary" in text
            assert "undecided by then counts as rejected" in text


async def test_async_iteration_ends_when_the_approver_closes(tmp_path):
    """`async for` yields each new request and stops when the approver is closed."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g:
            gateway = await FakeGateway(g).start()
            alice = Approver(h.peer("human:alice"))
            await alice.start()
            await gateway.request("appr-1")
            got = []
            async with asyncio.timeout(scaled(5)):
                async for request in alice:
                    got.append(request.approval_id)
                    await alice.close()
            assert got == ["appr-1"]
            await alice.close()  # idempotent


async def test_expired_and_foreign_requests_are_not_kept(tmp_path):
    """A request past its expiry, or from anyone but the gateway, is answered processed: false."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g, Approver(h.peer("human:alice")) as alice:
            gateway = await FakeGateway(g).start()
            past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
            assert (await gateway.request("old", expires_at=past)).delivered_to == 0
            assert (await gateway.request("bad", kind="weird")).delivered_to == 0
            assert alice.pending == {}
        # Only the gateway role may publish requests; an approver's impostor never gets through.
        async with h.peer("human:mallory") as mallory, Approver(h.peer("human:bob")) as bob:
            with pytest.raises(InvalidParams):
                await mallory.send(APPROVAL_TOPIC, "bcp_approval_request", request_content())
            assert bob.pending == {}


async def test_next_request_waits_for_a_request_and_for_close(tmp_path):
    """A waiting next_request wakes on a new request, and raises PeerClosed on close."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g:
            gateway = await FakeGateway(g).start()
            alice = Approver(h.peer("human:alice"))
            await alice.start()
            waiting = asyncio.create_task(alice.next_request())
            await gateway.request("appr-1")
            async with asyncio.timeout(scaled(5)):
                assert (await waiting).approval_id == "appr-1"
            waiting = asyncio.create_task(alice.next_request())
            await alice.close()
            with pytest.raises(PeerClosed):
                async with asyncio.timeout(scaled(5)):
                    await waiting


async def test_callbacks_limits_and_the_gateway_id(tmp_path):
    """Callbacks run (a failing one is logged), max_pending is a bound, only the gateway asks."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g:
            gateway = await FakeGateway(g).start()
            async with Approver(h.peer("human:alice"), max_pending=1) as alice:
                seen: list[str] = []

                @alice.on_request
                async def record(request: BcpApprovalRequest) -> None:
                    seen.append(request.approval_id)

                @alice.on_request
                def fail(request: BcpApprovalRequest) -> None:
                    raise RuntimeError("a broken callback does not lose the request")

                assert (await gateway.request("appr-1")).delivered_to == 1
                assert (await gateway.request("appr-2")).delivered_to == 0
                assert seen == ["appr-1"] and list(alice.pending) == ["appr-1"]
            async with Approver(h.peer("human:bob"), gateway_id="system:other") as bob:
                assert (await gateway.request("appr-3")).delivered_to == 0
                assert bob.pending == {}


async def test_a_request_that_expires_while_pending_is_dropped(tmp_path, monkeypatch):
    """Once its expires_at passes, a request leaves pending and is not handed out."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g, Approver(h.peer("human:alice")) as alice:
            gateway = await FakeGateway(g).start()
            await gateway.request("appr-1")
            assert list(alice.pending) == ["appr-1"]
            later = datetime.now(UTC) + timedelta(hours=1)
            monkeypatch.setattr("peers.approver._now", lambda: later)
            assert alice.pending == {}
            await gateway.request("appr-2", expires_at=(later + timedelta(minutes=1)).isoformat())
            async with asyncio.timeout(scaled(5)):
                assert (await alice.next_request()).approval_id == "appr-2"


async def test_decisions_reach_the_gateway_from_the_authenticated_approver(tmp_path):
    """approve, reject and edit arrive at the gateway with `from` set to the approver."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g, Approver(h.peer("human:alice")) as alice:
            gateway = await FakeGateway(g).start()
            for approval_id in ("a1", "a2", "a3"):
                await gateway.request(approval_id)
            assert await alice.approve("a1")
            assert await alice.reject("a2", reason="off topic")
            assert await alice.edit("a3", {"summary": "Shorter."})
            got = [await gateway.decisions.get() for _ in range(3)]
            assert [m.sender for m in got] == ["human:alice"] * 3
            assert [m.content for m in got] == [
                {"approval_id": "a1", "decision": "approve"},
                {"approval_id": "a2", "decision": "reject", "reason": "off topic"},
                {
                    "approval_id": "a3",
                    "decision": "edit",
                    "edited_response": {"summary": "Shorter."},
                },
            ]
            assert alice.pending == {}


async def test_a_refused_decision_returns_false_even_with_other_approvers_listening(tmp_path):
    """Only the gateway's processed: true counts: another approver observing does not."""
    async with running_bus(tmp_path) as h:
        async with (
            h.peer("system:gateway") as g,
            Approver(h.peer("human:alice")) as alice,
            Approver(h.peer("human:bob")) as bob,
        ):
            gateway = await FakeGateway(g).start()
            await gateway.request("appr-1")
            assert not await alice.approve("never-asked")
            assert "appr-1" in alice.pending  # a refusal keeps it
            assert await alice.approve("appr-1")
            # bob saw alice's decision on the topic and dropped the request.
            assert bob.pending == {}
            assert not await bob.reject("appr-1")  # already decided
            # bob answered alice's two decisions processed: false.
            observed = h.rows(event="process_finish", actor="human:bob", status="not_processed")
            assert [row["error"].split(":")[0] for row in observed] == ["observed", "observed"]
            # The gateway's replies: never asked, then already decided.
            refused = h.rows(event="process_finish", actor="system:gateway", status="not_processed")
            assert [row["error"].split(":")[0] for row in refused] == [
                "unknown_approval",
                "already_decided",
            ]


async def test_a_malformed_decision_is_refused_before_sending(tmp_path):
    """`edit` without a response is a ValueError; nothing reaches the gateway."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g, Approver(h.peer("human:alice")) as alice:
            gateway = await FakeGateway(g).start()
            with pytest.raises(ValueError):
                await alice.decide("appr-1", "edit")
            with pytest.raises(ValueError):
                await alice.decide("appr-1", "approve", edited_response={"summary": "x"})
            assert gateway.decisions.empty()


async def test_a_non_approver_cannot_decide(tmp_path):
    """agent:main may neither send bcp_approval_decision nor subscribe to system:approval."""
    async with running_bus(tmp_path) as h:
        async with h.peer("system:gateway") as g, h.peer("agent:main") as main:
            gateway = await FakeGateway(g).start()
            await gateway.request("appr-1")
            with pytest.raises(InvalidParams) as caught:
                await Approver(main).approve("appr-1")
            assert caught.value.code == -32602
            with pytest.raises(InvalidParams):
                await Approver(main).start()
            assert gateway.decisions.empty() and gateway.open == {"appr-1"}


def test_render_neutralizes_terminal_controls_in_untrusted_text():
    """ANSI escapes, C1 controls, bidi and zero-width characters are shown escaped, never raw."""
    content = request_content(response={"summary": HOSTILE}, approval_id="x\x1b[31m")
    text = render_request(content)
    assert text.isprintable() is False  # only because of the newlines between lines
    for line in text.split("\n"):
        assert line.isprintable(), repr(line)
    assert "\\x1b[2J" in text and "\\u202e" in text and "\\x9b" in text and "\\u200b" in text
    assert "\\x07" in text and "\\r" not in text and "\\x0d" in text
    # The forged end marker stays inside the block: every untrusted line starts with '|'.
    block = text.split("--- BEGIN UNTRUSTED TEXT")[1].split("\n--- END UNTRUSTED TEXT")[0]
    body = block.split("\n")[1:]
    assert body and all(line.startswith("|") for line in body)
    assert "x\\x1b[31m" in text.split("\n")[0]


def test_render_shows_every_kind_of_spec_and_tolerates_missing_parts():
    """Cat-1, Cat-2 and escalation requests render; a partial dict renders without raising."""
    cat1 = {
        "category": 1,
        "fields": [
            {"name": "urgent", "type": "boolean"},
            {"name": "score", "type": "integer", "min": 1, "max": 5},
            {"name": "mood", "type": "enum", "values": ["up", "down"]},
        ],
    }
    text = render_request(request_content(spec=cat1, response={"urgent": True, "score": 3}))
    assert "urgent: boolean" in text and "score: integer 1..5" in text
    assert "mood: one of up | down" in text and "| urgent: true" in text
    cat2 = {
        "category": 2,
        "questions": [
            {"id": "q1", "question": "Who?", "max_words": 5, "expected_format": "person_name"}
        ],
    }
    text = render_request(request_content(spec=cat2, response={"q1": "Jane Smith"}))
    assert "q1 (person_name, up to 5 words): Who?" in text and "| q1: Jane Smith" in text
    escalation = BcpApprovalRequest.model_validate(
        request_content(
            kind="escalation",
            response=None,
            task_id="t-1",
            from_category=1,
            escalation_justification="Need the \x1b[1mgist\x1b[0m.",
            expires_at=None,
            anomalies=[],
        )
    )
    text = render_request(escalation)
    assert "escalates    from category 1 to 3" in text and "agent main (controller)" in text
    assert "Need the \\x1b[1mgist" in text and "Anomalies: none" in text
    assert "expires      not given" in text
    partial = render_request({"approval_id": "p"})
    assert "no spec in the request" in partial and "| (nothing)" in partial
    assert UNTRUSTED_NOTICE[:20] in partial


def test_render_counts_down_to_expiry():
    """The expiry shows the time left, or that it has passed."""
    now = datetime(2026, 1, 1, tzinfo=UTC)
    soon = request_content(expires_at="2026-01-01T00:09:58Z")
    assert "(in 9m 58s;" in render_request(soon, now=now)
    assert "(in 1d 2h;" in render_request(request_content(expires_at="2026-01-02T02:00Z"), now=now)
    assert "(in 3h 5m;" in render_request(request_content(expires_at="2026-01-01T03:05Z"), now=now)
    assert "expires      not given" in render_request(request_content(expires_at="soon"), now=now)
    assert "EXPIRED 5s ago" in render_request(
        request_content(expires_at="2025-12-31T23:59:55+00:00"), now=now
    )


def test_neutralize_keeps_printable_text():
    """Ordinary text, accents and CJK pass through; controls do not."""
    assert neutralize("Zoë Saldaña 東京 (p < 0.05)") == "Zoë Saldaña 東京 (p < 0.05)"
    assert neutralize("a\tb\nc\x00\U000e0041") == "a\\x09b\\x0ac\\x00\\U000e0041"


def make_approvals_db(path: Path, rows: list[dict[str, Any]] | None = None) -> Path:
    """Create the gateway's bcp_approvals table in ``path`` with ``rows``."""
    with closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS bcp_approvals (approval_id TEXT PRIMARY KEY, "
            "status TEXT NOT NULL, created_ts TEXT NOT NULL, expires_ts TEXT, "
            "request_json TEXT NOT NULL, decided_by TEXT, decided_ts TEXT, decision_json TEXT)"
        )
        for row in rows or ():
            db.execute(
                "INSERT INTO bcp_approvals VALUES (:approval_id, :status, :created_ts, "
                ":expires_ts, :request_json, :decided_by, :decided_ts, :decision_json)",
                {"decided_by": None, "decided_ts": None, "decision_json": None, **row},
            )
    return path


def approval_row(approval_id: str, status: str = "pending", **overrides: Any) -> dict[str, Any]:
    """A bcp_approvals row for ``request_content(approval_id)``."""
    content = request_content(approval_id)
    return {
        "approval_id": approval_id,
        "status": status,
        "created_ts": f"2026-01-01T00:00:0{len(approval_id) % 10}Z",
        "expires_ts": content["expires_at"],
        "request_json": json.dumps(content),
        **overrides,
    }


def test_read_approvals_from_the_gateway_database(tmp_path):
    """Open approvals are pending and unexpired; a missing table means none; no file is an error."""
    db = tmp_path / "bcpbus.db"
    sqlite3.connect(db).close()
    assert read_approvals(db) == [] and read_approval(db, "a") is None
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    decision = json.dumps({"approval_id": "a2", "decision": "approve"})
    make_approvals_db(
        db,
        [
            approval_row("a1"),
            approval_row("a2", "approved", decided_by="human:bob", decision_json=decision),
            approval_row("a3", expires_ts=past),
            approval_row("a4", request_json="not json"),
        ],
    )
    assert [a.approval_id for a in read_approvals(db)] == ["a1", "a4"]
    assert [a.approval_id for a in read_approvals(db, open_only=False)] == [
        "a1",
        "a2",
        "a3",
        "a4",
    ]
    stored = read_approval(db, "a2")
    assert stored is not None and stored.decided_by == "human:bob"
    assert stored.decision == {"approval_id": "a2", "decision": "approve"}
    assert stored.to_dict()["request"]["approval_id"] == "a2"
    assert read_approval(db, "a4").request == {}  # type: ignore[union-attr]
    with pytest.raises(FileNotFoundError):
        read_approvals(tmp_path / "missing.db")
