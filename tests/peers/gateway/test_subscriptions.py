"""Reader-pushed subscriptions end to end: errors, rate limits, approvals, offline controllers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from peers import Controller, Reader
from peers.gateway.bits import value_bits
from peers.gateway.runner import running_gateway
from peers.gateway.settings import GatewaySettings
from peers.testing import BcpHarness, Inbox, running_bcp, scaled

MAIN = """---
name: main
bcp_channels:
  - peer: researcher
    role: controller
    max_category: 3
    budget_bits: 5000
    delivery_quantum: 0
    subscriptions:
      - id: alerts
        category: 1
        fields:
          - {name: urgent, type: boolean}
        min_interval_s: 3600
      - id: hourly
        category: 1
        fields:
          - {name: level, type: integer, min: 0, max: 7}
        min_interval_s: 0.001
        max_per_hour: 2
      - id: digest
        category: 3
        directive: Summarize what changed.
        max_words: 20
        min_interval_s: 0.001
      - id: notes
        category: 2
        questions:
          - {id: note, question: "Anything new?", max_words: 5, expected_format: short_text}
        min_interval_s: 0.001
  - peer: scout
    role: controller
    max_category: 1
    budget_bits: 100
---
"""
READER = """---
name: {name}
bcp_channels:
  - peer: main
    role: reader
    max_category: 3
    budget_bits: 5000
    delivery_quantum: 0
---
"""


@pytest.fixture
def agents_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "agents"
    directory.mkdir()
    (directory / "main.md").write_text(MAIN)
    for name in ("researcher", "scout"):
        (directory / f"{name}.md").write_text(READER.format(name=name))
    return directory


async def started(h: BcpHarness, *names: str) -> list[Any]:
    peers: list[Any] = []
    for name in names:
        peer = h.controller(name) if name == "main" else h.reader(name)
        await peer.start()
        peers.append(peer)
    return peers


async def test_reader_learns_its_subscriptions_on_join(tmp_path, agents_dir):
    """bcp_subscriptions_active lists what targets the reader; a reader with none gets []."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        researcher, scout = await started(h, "researcher", "scout")
        try:
            async with asyncio.timeout(scaled(10)):
                await researcher.subscriptions_received.wait()
                await scout.subscriptions_received.wait()
            ids = [s["subscription_id"] for s in researcher.subscriptions]
            assert ids == ["alerts", "hourly", "digest", "notes"]
            assert researcher.subscriptions[0] == {
                "subscription_id": "alerts",
                "controller": "main",
                "category": 1,
                "fields": [{"name": "urgent", "type": "boolean"}],
            }
            assert scout.subscriptions == []
        finally:
            await researcher.close()
            await scout.close()


async def test_push_errors(tmp_path, agents_dir):
    """Unknown ids, another reader's subscription, a made-up controller, a changed spec."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        main, researcher, scout = await started(h, "main", "researcher", "scout")
        try:
            cases = [
                (researcher, "nope", "main", {"urgent": True}, "subscription_not_found"),
                (scout, "alerts", "main", {"urgent": True}, "subscription_not_found"),
                (researcher, "alerts", "other", {"urgent": True}, "unknown_channel"),
                (researcher, "alerts", "main", {"urgent": True, "extra": 1}, "validation_failed"),
                (researcher, "alerts", "main", {"urgent": "true"}, "validation_failed"),
            ]
            for reader, sid, controller, response, error in cases:
                verdict = await reader.publish(sid, controller, response)
                assert verdict.success is False and verdict.error == error, verdict
                assert verdict.subscription_id == sid
        finally:
            for peer in (main, researcher, scout):
                await peer.close()
        refused = [r["status"] for r in h.bus.rows(event="bcp_push_refused")]
        assert refused.count("subscription_not_found") == 2


async def test_a_push_naming_another_controller_on_the_channel_is_refused(tmp_path, agents_dir):
    """The content's controller must be the channel's: a made-up one is subscription_not_found."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        [researcher] = await started(h, "researcher")
        try:
            content = {"subscription_id": "alerts", "controller": "ghost", "response": {}}
            result = await researcher.peer.send("bcp:main:researcher", "bcp_response", content)
            assert result.delivered_to == 0
            async with asyncio.timeout(scaled(10)):
                verdict = await researcher.next_result()
            assert verdict.error == "subscription_not_found"
        finally:
            await researcher.close()


async def test_rate_limits(tmp_path, agents_dir):
    """min_interval_s and max_per_hour refuse pushes with rate_limited."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        main, researcher = await started(h, "main", "researcher")
        pushed = Inbox()
        main.on_delivery(pushed)
        try:
            assert (await researcher.publish("alerts", "main", {"urgent": True})).success
            second = await researcher.publish("alerts", "main", {"urgent": False})
            assert second.error == "rate_limited"
            for level in (1, 2):
                assert (await researcher.publish("hourly", "main", {"level": level})).success
            third = await researcher.publish("hourly", "main", {"level": 3})
            assert third.error == "rate_limited"
            assert len(pushed.messages) == 3
        finally:
            await main.close()
            await researcher.close()


async def test_cat3_push_waits_for_a_human_every_time(tmp_path, agents_dir):
    """A Cat-3 push is held for approval; rejected, the reader is told approval_rejected."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        main, researcher = await started(h, "main", "researcher")
        pushed, approvals = Inbox(), Inbox()
        main.on_delivery(pushed)
        human = h.bus.peer("human:bob")
        human.handle("bcp_approval_request", approvals)
        await human.connect()
        await human.subscribe("system:approval")
        try:
            for decision in ("approve", "reject"):
                verdict = await researcher.publish("digest", "main", {"summary": "Two changes."})
                assert verdict.success is True and "approval" in verdict.detail
                request = (await approvals.get()).content
                assert request["subscription_id"] == "digest" and request["untrusted"] is True
                await human.send(
                    "system:approval",
                    "bcp_approval_decision",
                    {"approval_id": request["approval_id"], "decision": decision},
                )
            delivered = await pushed.get()
            assert delivered["response"] == {"summary": "Two changes."}
            async with asyncio.timeout(scaled(10)):
                while True:
                    result = await researcher.next_result()
                    if result.error == "approval_rejected":
                        break
            assert pushed.empty()
        finally:
            await human.close()
            await main.close()
            await researcher.close()


async def test_offline_controller_gets_held_pushes_in_order_even_after_a_restart(
    tmp_path, agents_dir
):
    """Pushes to an offline controller are held, survive a gateway restart, arrive in order."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        [researcher] = await started(h, "researcher")
        for note in ("first", "second", "third"):
            verdict = await researcher.publish("notes", "main", {"note": note})
            assert verdict.success is True and "held" in verdict.detail
        assert len(h.bus.rows(event="bcp_held")) == 3
        await h.gateway.close()
        token = h.bus.token("system:gateway")
        async with running_gateway(h.bus.url, token, h.bus.log, agents_dir):
            main = Controller(h.bus.peer("agent:main"))
            pushed = Inbox()
            main.on_delivery(pushed)
            await main.start()
            try:
                notes = [(await pushed.get())["response"]["note"] for _ in range(3)]
                assert notes == ["first", "second", "third"]
            finally:
                await main.close()
        await researcher.close()


async def test_held_push_expires_and_the_reader_is_told(tmp_path, agents_dir):
    """After outbox_ttl the held push expires: controller_unavailable, and a bcp_expired row."""
    settings = GatewaySettings(outbox_ttl=0.3)
    async with running_bcp(tmp_path, agents_dir=agents_dir, settings=settings) as h:
        [researcher] = await started(h, "researcher")
        try:
            verdict = await researcher.publish("notes", "main", {"note": "late"})
            assert verdict.success is True
            async with asyncio.timeout(scaled(10)):
                while True:
                    result = await researcher.next_result()
                    if result.error == "controller_unavailable":
                        break
            expired = h.bus.rows(event="bcp_expired", status="controller_unavailable")
            assert json.loads(expired[0]["payload_json"])["subscription_id"] == "notes"
        finally:
            await researcher.close()


async def test_pushes_charge_the_shared_budget(tmp_path, agents_dir):
    """Every accepted push is a bcp_bits_charged row against the channel."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        main, researcher = await started(h, "main", "researcher")
        main.on_delivery(Inbox())
        try:
            await researcher.publish("notes", "main", {"note": "one"})
            await researcher.publish("hourly", "main", {"level": 7})
        finally:
            await main.close()
            await researcher.close()
        charges = [json.loads(r["payload_json"]) for r in h.bus.rows(event="bcp_bits_charged")]
        assert [c["subscription_id"] for c in charges] == ["notes", "hourly"]
        # What each value carries, and a bit that a push came (no grid on this channel).
        note = value_bits("one", 5, "short_text") + 1
        assert [c["bits"] for c in charges] == [pytest.approx(note), 4.0]
        assert h.gateway.ledger.used(("main", "researcher")) == pytest.approx(note + 4.0)


def test_reader_and_controller_need_agent_ids():
    """The BCP SDK refuses a peer that is not agent:<name>."""
    from peers import Peer

    with pytest.raises(ValueError):
        Reader(Peer("ws://x", "human:bob", "t"))
    with pytest.raises(ValueError):
        Controller(Peer("ws://x", "tg:1", "t"))


async def test_a_push_held_while_the_controller_was_away_reaches_it_once(tmp_path, agents_dir):
    """The controller fetches the first copy by epoch when it reconnects, and the gateway sends
    the held one too: both carry one delivery_id, so the handler sees the push once."""
    async with running_bcp(tmp_path, agents_dir=agents_dir) as h:
        main, researcher = await started(h, "main", "researcher")
        pushed = Inbox()
        main.on_delivery(pushed)
        try:
            await h.bus.bus.peers["agent:main"].close(1001, "going away")  # the SDK reconnects
            verdict = await researcher.publish("notes", "main", {"note": "while away"})
            assert verdict.success is True and "held" in verdict.detail
            first = await pushed.get()
            assert first["response"] == {"note": "while away"} and first["delivery_id"]
            # Nothing overtakes what the gateway holds: once a later push arrives, the held copy
            # of the first was sent before it, and must not have reached the handler.
            assert (await researcher.publish("notes", "main", {"note": "after"})).success
            second = await pushed.get()
            assert second["response"] == {"note": "after"}, "the held copy came a second time"
            assert any(
                "hold_id" in json.loads(r["payload_json"])
                for r in h.bus.rows(event="bcp_delivered")
            ), "the gateway never sent its held copy: the test proved nothing"
        finally:
            await main.close()
            await researcher.close()
