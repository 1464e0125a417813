"""What a webhook's answer can make the bus hold is bounded: a size cap read as a stream, and one
deadline for the whole answer."""

from __future__ import annotations

import json

from peers.testing import Inbox, running_bus, scaled
from schemas.bus import DeliveryStatus

from .test_http import settings
from .webhook_receiver import RawReceiver

BIG = 32 << 20


def endless(body: bytes) -> bytes:
    """A 200 whose body (no Content-Length: it ends when the socket does) is 32 MiB."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    return head + b'{"jsonrpc":"2.0","id":1,"result":{"pad":"' + b"x" * BIG + b'"}}'


def declared(body: bytes) -> bytes:
    """A 200 that declares a body larger than the cap."""
    return b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\nConnection: close\r\n\r\n" + b" " * 100


async def test_an_answer_past_the_cap_fails_the_delivery_and_is_not_read(tmp_path):
    """A 32 MiB answer is cut off past webhook_max_answer_bytes: the delivery fails as
    too_large, the bus stops reading long before the end, and the sender is told."""
    http = settings(webhook_attempts=1, webhook_max_answer_bytes=4096)
    async with running_bus(tmp_path, http=http) as h:
        async with RawReceiver(endless) as big, RawReceiver(declared) as liar:
            await h.webhook_peer("tg:1", big.url)
            await h.webhook_peer("tg:2", liar.url)
            inbox = Inbox()
            async with h.peer("agent:w1") as agent:
                agent.handle("delivery_status", inbox)
                first = await agent.send("tg:1", "tg_reply", {}, message_id="big-1")
                second = await agent.send("tg:2", "tg_reply", {}, message_id="big-2")
                statuses = [await inbox.get_type("delivery_status", scaled(10)) for _ in "12"]
        assert first.delivered_to == second.delivered_to == 0
        assert big.sent < BIG // 2  # the bus hung up; the kernel's buffers took the rest
    reasons = {DeliveryStatus.model_validate(s.content).reason for s in statuses}
    assert reasons == {"too_large"}
    for message_id in ("big-1", "big-2"):
        row = h.rows(message_id=message_id, event="delivery_failed")[0]
        assert row["status"] == "too_large" and "webhook_max_answer_bytes (4096" in row["error"]


def trickle(body: bytes) -> bytes:
    """A valid answer, which the receiver sends a byte every 20 ms."""
    answer = json.dumps({"jsonrpc": "2.0", "id": json.loads(body)["id"], "result": {}})
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(answer) + 4096}\r\n\r\n"
    return (head + answer + " " * 4096).encode()


async def test_an_answer_trickled_byte_by_byte_times_out_as_a_whole(tmp_path):
    """Each byte comes long before httpx's per-read timeout, but the attempt has one deadline:
    webhook_timeout ends it."""
    http = settings(webhook_attempts=1, webhook_timeout=scaled(0.5))
    async with running_bus(tmp_path, http=http) as h:
        async with RawReceiver(trickle, chunk=1, pause=0.02) as slow:
            await h.webhook_peer("tg:1", slow.url)
            async with h.peer("agent:w1") as agent:
                result = await agent.send("tg:1", "tg_reply", {}, message_id="slow-1")
    assert result.delivered_to == 0
    assert h.rows(message_id="slow-1", event="delivery_failed")[0]["status"] == "timeout"
