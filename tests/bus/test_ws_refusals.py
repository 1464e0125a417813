"""Anonymous WebSocket clients cannot grow the log: their refusals are counted, one row per
interval, while authenticated peers keep their own rows."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bus.ops.config import Limits
from bus.ops.refusals import MAX_LISTED, Refusals
from peers.testing import running_bus, scaled

pytestmark = pytest.mark.usefixtures("each_transport")
"""Every test here runs on both WebSocket transports (tests/bus/conftest.py)."""

INTERVAL = 0.25
"""Seconds between two ws_refused rows in these tests."""


async def closed_with(ws: Any) -> int:
    """Wait for the bus to close ``ws``; return the close code."""
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(scaled(10)):
            while True:
                await ws.recv()
    return int(ws.close_code)


async def wrong_token(url: str, slots: asyncio.Semaphore) -> int:
    """One socket that initializes with a token no peer has; its close code."""
    async with slots, connect(url) as ws:
        params = {"clientId": "agent:w1", "auth": {"token": "bcpbus_not-a-token"}}
        await ws.send(
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params})
        )
        async with asyncio.timeout(scaled(10)):
            reply = json.loads(await ws.recv())
        assert reply["error"]["code"] == -32002
        return await closed_with(ws)


async def silent(url: str, slots: asyncio.Semaphore) -> int:
    """One socket that never initializes; its close code."""
    async with slots, connect(url) as ws:
        return await closed_with(ws)


async def test_300_anonymous_sockets_write_a_bounded_number_of_rows(tmp_path):
    """150 sockets with a wrong token and 150 that never initialize write only ws_refused rows,
    at most one per interval, with the right counts; a real peer still connects and keeps its
    connect, initialize and disconnect rows."""
    # The wrong tokens' answers must come before the watchdog closes their sockets (4002):
    # with 60 sockets at once on a machine running other tests, a second was too tight.
    limits = Limits(
        initialize_timeout=scaled(3),
        max_anonymous_connections=None,
        max_anonymous_per_address=None,
        refusal_log_interval=INTERVAL,
    )
    async with running_bus(tmp_path, limits=limits) as h:
        await h.log.commit()
        before = len(h.rows())
        loop = asyncio.get_running_loop()
        started = loop.time()
        slots = asyncio.Semaphore(60)
        codes = await asyncio.gather(
            *(wrong_token(h.url, slots) for _ in range(150)),
            *(silent(h.url, slots) for _ in range(150)),
        )
        assert codes == [4003] * 150 + [4002] * 150
        async with h.peer("agent:w1") as peer:
            assert (await peer.ping()).pong is True
        await h.bus.close()
        elapsed = loop.time() - started
        reasons = await h.refused()
        rows = h.rows()[before:]
    assert reasons == {"wrong_token": 150, "initialize_timeout": 150}
    assert h.bus.refusals.total == reasons
    summaries = [row for row in rows if row["event"] == "ws_refused"]
    assert 1 <= len(summaries) <= elapsed / INTERVAL + 2
    addresses = [a for row in summaries for a in json.loads(row["payload_json"])["addresses"]]
    assert {a["address"] for a in addresses} == {"127.0.0.1"}
    assert sum(a["count"] for a in addresses) == 300
    per_connection = ("connect", "initialize", "disconnect", "auth_failed", "initialize_timeout")
    per_connection += ("rpc_error", "limit_exceeded", "frame_refused", "frame_too_large")
    connect, initialize, disconnect = [row for row in rows if row["event"] in per_connection]
    assert connect["event"] == "connect" and connect["actor"].startswith("('127.0.0.1'")
    assert (initialize["event"], initialize["actor"]) == ("initialize", "agent:w1")
    assert (disconnect["event"], disconnect["actor"]) == ("disconnect", "agent:w1")
    assert len(rows) - len(summaries) < 20  # the peer's and the presence rows: not per socket


async def test_errors_before_initialize_are_counted_not_logged(tmp_path):
    """Requests before initialize, a binary frame and an error flood are counted into ws_refused;
    the same from an authenticated peer still get rows of their own."""
    async with running_bus(tmp_path, limits=Limits(refusal_log_interval=60.0)) as h:
        async with connect(h.url) as ws:
            for n in range(10):
                await ws.send(json.dumps({"jsonrpc": "2.0", "id": n, "method": "ping"}))
            assert await closed_with(ws) == 1008
        async with connect(h.url) as ws:
            await ws.send(b"\x00binary")
            assert await closed_with(ws) == 1003
        async with h.peer("agent:w1") as peer:
            await peer.ping()
        assert await h.refused() == {"rpc_error": 10, "anonymous_errors": 1, "frame_refused": 1}
        assert not h.rows(event="rpc_error")
        assert not h.rows(event="limit_exceeded")
        assert len(h.rows(event="connect")) == 1


def test_a_summary_row_lists_the_busiest_addresses_and_sums_the_rest(tmp_path):
    """Refusals from more addresses than a row lists are summed as others, so the row stays
    small whatever the client spreads over."""
    recorded: list[tuple[str, dict[str, Any]]] = []

    class Log:
        def record(self, event: str, **columns: Any) -> None:
            recorded.append((event, columns))

    refusals = Refusals(Log(), 10.0, event="ws_refused")  # type: ignore[arg-type]
    for n in range(MAX_LISTED + 5):
        refusals.count("wrong_token", f"10.0.0.{n}")
    refusals.count("wrong_token", "10.0.0.0")
    refusals.count("initialize_timeout", "2001:db8::1")
    refusals.count("initialize_timeout", "2001:db8::2")  # the same /64
    refusals.flush()
    refusals.flush()  # nothing new: no row
    ((event, columns),) = recorded
    payload = columns["payload"]
    assert event == "ws_refused" and columns["status"] == "aggregate"
    assert payload["total"] == MAX_LISTED + 8
    assert payload["reasons"] == {"initialize_timeout": 2, "wrong_token": MAX_LISTED + 6}
    assert len(payload["addresses"]) == MAX_LISTED
    assert payload["addresses"][0]["count"] == 2
    assert payload["others"] == payload["total"] - sum(a["count"] for a in payload["addresses"])
