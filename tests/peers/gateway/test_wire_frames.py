"""Every frame the gateway sends, checked against the JSON Schema files peers are told to trust.

Each flow runs on a real bus with raw peers that record every delivery; every BCP frame the
controller, the reader and the approver receive must validate against ``schemas/json/``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from peers import Message, Peer
from peers.gateway.settings import GatewaySettings
from peers.testing import BcpHarness, Inbox, running_bcp
from schemas.bcp import CONTENT_MODELS

from .test_flows import CAT1, CAT3, agents
from .test_subscriptions import MAIN, READER

SCHEMAS = Path(__file__).resolve().parents[3] / "schemas" / "json"
TOPIC = "bcp:main:researcher"
GOOD = {"has_pricing": True, "tier": "pro", "rating": 4, "region": "eu"}
BAD = {"has_pricing": "yes", "tier": "pro", "rating": 4, "region": "eu"}


def check(message: Message) -> None:
    """Validate one received BCP frame against its schema file and its model."""
    validator = Draft202012Validator(json.loads((SCHEMAS / f"{message.type}.json").read_text()))
    errors = [e.message for e in validator.iter_errors(message.content)]
    assert not errors, (message.type, message.content, errors)
    CONTENT_MODELS[message.type].model_validate(message.content)


class Frames:
    """Raw controller, reader and approver peers whose every delivery is recorded."""

    def __init__(self, h: BcpHarness) -> None:
        self.h = h
        self.inboxes: dict[str, Inbox] = {}
        self.peers: dict[str, Peer] = {}

    async def join(self, client_id: str, *topics: str) -> Peer:
        peer = self.h.bus.peer(client_id)
        inbox = self.inboxes.setdefault(client_id, Inbox())
        peer.handle(None, inbox)
        await peer.connect()
        for topic in topics:
            await peer.subscribe(topic)
        self.peers[client_id] = peer
        return peer

    async def leave(self, client_id: str) -> None:
        await self.peers.pop(client_id).close()

    async def get(self, client_id: str, message_type: str) -> dict[str, Any]:
        return (await self.inboxes[client_id].get_type(message_type, seconds=10)).content

    def checked(self) -> set[str]:
        """Validate every recorded BCP frame; return the message types seen."""
        seen: set[str] = set()
        for inbox in self.inboxes.values():
            for message in inbox.messages:
                if message.type in CONTENT_MODELS:
                    check(message)
                    seen.add(message.type)
        return seen


@asynccontextmanager
async def frames(h: BcpHarness) -> AsyncIterator[Frames]:
    f = Frames(h)
    try:
        yield f
    finally:
        for client_id in list(f.peers):
            await f.leave(client_id)


async def ask(f: Frames, query_id: str, spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return await f.peers["agent:main"].send(
        TOPIC, "bcp_query_request", {"query_id": query_id, **spec, **extra}
    )


async def answer(f: Frames, query_id: str, response: Any) -> dict[str, Any]:
    return await f.peers["agent:researcher"].send(
        TOPIC, "bcp_response", {"query_id": query_id, "response": response}
    )


async def decide(f: Frames, approval_id: str, decision: str, **extra: Any) -> dict[str, Any]:
    return await f.peers["human:alice"].send(
        "system:approval",
        "bcp_approval_decision",
        {"approval_id": approval_id, "decision": decision, **extra},
    )


async def test_query_flows_send_frames_that_match_the_schema_files(tmp_path):
    """Answers, retries, refusals, approvals, edits, escalation and expiry send valid frames."""
    settings = GatewaySettings(query_ttl=1.0)
    async with running_bcp(tmp_path, agents_dir=agents(tmp_path), settings=settings) as h:
        async with frames(h) as f:
            await f.join("agent:main")
            await f.join("agent:researcher")
            await f.join("human:alice", "system:approval")
            # Answered at once.
            await ask(f, "q1", CAT1)
            await f.get("agent:researcher", "bcp_query")
            await answer(f, "q1", GOOD)
            await f.get("agent:main", "bcp_response_delivery")
            # Invalid answers until the retries run out.
            await ask(f, "q2", CAT1)
            for _ in range(3):
                await answer(f, "q2", BAD)
            assert (await f.get("agent:main", "bcp_query_failed"))["error"] == "retries_exhausted"
            # Refused at once: a reused query id, and an answer to no query.
            await ask(f, "q1", CAT1)
            assert (await f.get("agent:main", "bcp_query_failed"))["query_id"] == "q1"
            await answer(f, "nope", GOOD)
            # Cat-3 approved, edited and rejected.
            for query_id, decision, extra in (
                ("q3", "approve", {}),
                ("q4", "edit", {"edited_response": {"summary": "It is short."}}),
                ("q5", "reject", {"reason": "no"}),
            ):
                await ask(f, query_id, CAT3)
                await answer(f, query_id, {"summary": "A short summary of the document."})
                request = await f.get("human:alice", "bcp_approval_request")
                await decide(f, request["approval_id"], decision, **extra)
            # An escalation into Cat-3, approved.
            await ask(f, "q6", CAT1, task_id="t1")
            await answer(f, "q6", GOOD)
            await ask(f, "q7", CAT3, task_id="t1", escalation_justification="need more")
            request = await f.get("human:alice", "bcp_approval_request")
            assert request["kind"] == "escalation"
            await decide(f, request["approval_id"], "approve")
            # Expiry: no answer in time.
            await ask(f, "q8", CAT1)
            while (await f.get("agent:main", "bcp_query_failed"))["query_id"] != "q8":
                pass
            # Budget refusal.
            await ask(f, "q9", {**CAT3, "max_words": 2000})
            seen = f.checked()
    assert seen == {
        "bcp_subscriptions_active",
        "bcp_query",
        "bcp_validation_result",
        "bcp_response_delivery",
        "bcp_query_failed",
        "bcp_approval_request",
    }


async def test_subscription_flows_send_frames_that_match_the_schema_files(tmp_path):
    """Announcements, pushes, refusals, held and expired pushes and approvals send valid frames."""
    directory = tmp_path / "agents"
    directory.mkdir()
    (directory / "main.md").write_text(MAIN)
    for name in ("researcher", "scout"):
        (directory / f"{name}.md").write_text(READER.format(name=name))
    settings = GatewaySettings(outbox_ttl=0.5)
    async with running_bcp(tmp_path, agents_dir=directory, settings=settings) as h:
        async with frames(h) as f:
            reader = await f.join("agent:researcher")
            await f.join("human:alice", "system:approval")
            await f.get("agent:researcher", "bcp_subscriptions_active")

            async def push(sid: str, response: Any, controller: str = "main") -> None:
                content = {"subscription_id": sid, "controller": controller, "response": response}
                await reader.send(TOPIC, "bcp_response", content)

            # Held while the controller is offline, then expired.
            await push("notes", {"note": "late"})
            while (await f.get("agent:researcher", "bcp_validation_result")).get("error") != (
                "controller_unavailable"
            ):
                pass
            # Held, then flushed when the controller joins.
            await push("hourly", {"level": 3})
            await f.join("agent:main")
            await f.get("agent:main", "bcp_response_delivery")
            # Delivered at once, refused, and put to a human.
            await push("alerts", {"urgent": True})
            await push("alerts", {"urgent": False})
            await push("nope", {"urgent": True})
            await push("notes", {"note": "x", "extra": 1})
            for decision in ("approve", "reject"):
                await push("digest", {"summary": "Nothing changed today."})
                request = await f.get("human:alice", "bcp_approval_request")
                await decide(f, request["approval_id"], decision)
            while (await f.get("agent:researcher", "bcp_validation_result")).get("error") != (
                "approval_rejected"
            ):
                pass
            seen = f.checked()
    assert seen == {
        "bcp_subscriptions_active",
        "bcp_validation_result",
        "bcp_response_delivery",
        "bcp_approval_request",
    }
