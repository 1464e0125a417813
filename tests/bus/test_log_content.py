"""What the activity log keeps of each message: the whole envelope, or only its digest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bus.core.digest import canonical_json, canonical_sha256
from peers.testing import Inbox, running_bus

BCPBUS = [str(Path(sys.executable).with_name("bcpbus"))]


async def _send_one(harness, content):
    inbox = Inbox()
    async with harness.peer("agent:w1") as agent, harness.peer("tg:42") as tg:
        agent.handle(None, inbox)
        await agent.subscribe("agent:w1")
        await tg.send("agent:w1", "tg_message", content, message_id="m-1")
        return (await inbox.get()).payload


async def test_full_mode_stores_the_envelope_as_delivered(tmp_path):
    """``send_start`` holds the envelope the subscriber got, non-ASCII text included."""
    async with running_bus(tmp_path) as h:
        delivered = await _send_one(h, {"text": "héllo ☃", "n": [1, 2.5, None]})
        (start,) = h.rows(event="send_start", message_id="m-1")
        assert json.loads(start["payload_json"]) == delivered
        (begun,) = h.rows(event="bus_start")
        assert json.loads(begun["payload_json"])["log_content"] == "full"


async def test_digest_mode_keeps_the_type_and_a_hash_anyone_can_recompute(tmp_path):
    """``digest`` stores no content: the type and the SHA-256 of the canonical envelope."""
    async with running_bus(tmp_path, log_content="digest") as h:
        delivered = await _send_one(h, {"text": "secret-42"})
        (start,) = h.rows(event="send_start", message_id="m-1")
        assert "secret-42" not in start["payload_json"]
        stored = json.loads(start["payload_json"])
        assert stored == {"type": "tg_message", "sha256": canonical_sha256(delivered)}
        (begun,) = h.rows(event="bus_start")
        assert json.loads(begun["payload_json"])["log_content"] == "digest"


def test_canonical_json_sorts_keys_and_keeps_unicode():
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'.encode()


def test_serve_refuses_an_unknown_log_content_mode():
    result = subprocess.run(
        [*BCPBUS, "serve", "--log-content", "some"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "--log-content" in result.stderr
