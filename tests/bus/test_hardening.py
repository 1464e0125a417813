"""Hostile peers and bad days, on a real bus: each case of the hardening review, end to end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from bus.core.errors import AuditUnavailable
from bus.ops.config import Limits
from peers import Message
from peers.testing import BusHarness, Inbox, running_bus, scaled

pytestmark = pytest.mark.usefixtures("each_transport")
"""Every test here runs on both WebSocket transports (tests/bus/conftest.py)."""

ENVELOPE = {
    "type": "tg_message",
    "from": "tg:42",
    "timestamp": "2026-11-23T10:00:00Z",
}


def frame(method: str, params: Any = None, request_id: Any = 1) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message)


def send_params(message_id: str, content: Any, topic: str = "agent:w1") -> dict[str, Any]:
    return {"topic": topic, "payload": {**ENVELOPE, "messageId": message_id, "content": content}}


async def answer(ws: ClientConnection, text: str) -> dict[str, Any]:
    """Send one raw frame and return the answer, parsed strictly (NaN would fail here)."""
    await ws.send(text)
    async with asyncio.timeout(scaled(5)):
        reply = await ws.recv()
    return json.loads(reply, parse_constant=_not_json)  # type: ignore[no-any-return]


def _not_json(name: str) -> Any:
    raise AssertionError(f"the bus sent {name}, which is not JSON")


async def initialized(h: BusHarness, client_id: str, **kwargs: Any) -> ClientConnection:
    ws = await connect(h.url, **kwargs)
    reply = await answer(
        ws, frame("initialize", {"clientId": client_id, "auth": {"token": h.token(client_id)}})
    )
    assert "result" in reply, reply
    return ws


async def assert_bus_still_delivers(h: BusHarness, message_id: str) -> None:
    """A new peer pair exchanges a message and all four rows of it are committed."""
    inbox = Inbox()
    async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
        agent.handle(None, inbox)
        result = await tg.send(
            "agent:w1", "tg_message", {"text": "still here"}, message_id=message_id
        )
        assert result.delivered_to == 1
        assert (await inbox.get()).content == {"text": "still here"}
    events = [row["event"] for row in h.rows(message_id=message_id)]
    assert events == ["send_start", "process_start", "process_finish", "send_finish"]


# 1. No frame can hurt anyone but its sender.


async def test_lone_surrogate_id_before_initialize_cannot_wedge_the_log(tmp_path):
    """The critical frame (a lone surrogate as the id, before initialize) is a parse error and
    every later message of every peer is still delivered and logged."""
    async with running_bus(tmp_path) as h:
        async with connect(h.url) as ws:
            reply = await answer(ws, '{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}')
            assert reply["error"]["code"] == -32700 and reply["id"] is None
        await assert_bus_still_delivers(h, "after-surrogate-id")
        assert await h.refused() == {"rpc_error": 1}  # before initialize: counted, no row


async def test_lone_surrogate_in_message_id_or_content_is_refused_and_harms_no_one(tmp_path):
    """A logged-in peer's lone surrogate (messageId or content) is refused; the subscriber's
    socket stays open and gets the next message."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent:
            agent.handle(None, inbox)
            ws = await initialized(h, "tg:42")
            try:
                for params in (
                    send_params("\\ud800", {"text": "x"}),
                    send_params("m-1", {"text": "\\udfff"}),
                    send_params("m-2", {"\\ud83d": 1}),
                ):
                    text = frame("sendMessage", params).replace("\\\\", "\\")
                    reply = await answer(ws, text)
                    assert reply["error"]["code"] == -32700, reply
                reply = await answer(ws, frame("sendMessage", send_params("m-3", {"t": "ok"})))
                assert reply["result"]["deliveredTo"] == 1
                assert (await inbox.get()).content == {"t": "ok"}
            finally:
                await ws.close()


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
async def test_non_finite_numbers_are_refused(tmp_path, literal):
    """NaN, infinities and numbers that overflow a double never reach a receiver."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent:
            agent.handle(None, inbox)
            ws = await initialized(h, "tg:42")
            try:
                text = frame("sendMessage", send_params("m-1", {"n": 0})).replace(
                    '"n": 0', f'"n": {literal}'
                )
                reply = await answer(ws, text)
                assert reply["error"]["code"] == -32700
                assert inbox.empty()
            finally:
                await ws.close()


async def test_binary_frame_closes_with_1003(tmp_path):
    """A binary frame (even valid UTF-16 JSON) closes the connection with 1003 and a row."""
    async with running_bus(tmp_path) as h:
        ws = await initialized(h, "tg:42")
        await ws.send(frame("ping").encode("utf-16"))
        with pytest.raises(ConnectionClosed) as caught:
            async with asyncio.timeout(scaled(5)):
                await ws.recv()
        assert caught.value.rcvd is not None and caught.value.rcvd.code == 1003
        await ws.wait_closed()
        await h.log.commit()
        assert h.rows(event="frame_refused", status="binary")


# 2. Bounded memory per peer, whatever the peer does.


def _small_buffers(port: int) -> socket.socket:
    """A client socket with tiny kernel buffers, so a peer that stops reading backs the bus up
    after kilobytes rather than the megabytes loopback would buffer."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def _shrink_bus_side(h: BusHarness, client_id: str) -> None:
    """Give the bus's end of a peer's socket a tiny kernel send buffer, for the same reason."""
    sock = h.bus.peers[client_id].ws.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)


async def test_subscriber_that_stops_reading_fails_fast_then_is_disconnected(tmp_path):
    """Deliveries to a peer that reads nothing fail fast (slow_consumer) once its unread bytes
    pass max_write_buffer; after slow_consumer_timeout it is closed with 4004, and a healthy
    subscriber gets every message meanwhile."""
    limits = Limits(max_write_buffer=64 << 10, slow_consumer_timeout=0.5, process_timeout=30)
    async with running_bus(tmp_path, limits=limits) as h:
        healthy = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, healthy)
            stuck = await initialized(h, "agent:w2", sock=_small_buffers(h.bus.port), max_queue=1)
            _shrink_bus_side(h, "agent:w2")
            big = {"text": "x" * 60_000}
            # The bus's end: the stuck client pauses its own reading, so it sees nothing.
            closed = asyncio.create_task(h.bus.peers["agent:w2"].wait_closed())
            sends = []
            async with asyncio.timeout(scaled(15)):
                while not closed.done():  # keep publishing until the bus drops the peer
                    message_id = f"big-{len(sends)}"
                    sends.append(
                        asyncio.create_task(
                            tg.send("agent:w2", "tg_message", big, message_id=message_id)
                        )
                    )
                    await asyncio.wait({closed}, timeout=0.05)
            results = await asyncio.wait_for(asyncio.gather(*sends), scaled(10))
            assert all(result.delivered_to == 0 for result in results)
            stuck.transport.abort()
            assert await tg.send("agent:w1", "tg_message", {"text": "after"}, message_id="after")
            assert (await healthy.get_type("tg_message")).content == {"text": "after"}
        statuses = {row["status"] for row in h.rows(event="process_finish", actor="agent:w2")}
        assert "slow_consumer" in statuses
        assert h.rows(event="slow_consumer", actor="agent:w2", status="4004")
        assert "agent:w2" not in h.bus.peers


async def test_pipelined_requests_are_backpressured_not_queued(tmp_path):
    """A peer that pipelines pings and never reads the answers is stopped at
    max_inflight_requests (the bus stops reading it), then disconnected as a slow consumer."""
    limits = Limits(max_inflight_requests=8, slow_consumer_timeout=0.5)
    async with running_bus(tmp_path, limits=limits) as h:
        ws = await initialized(h, "tg:42", sock=_small_buffers(h.bus.port), max_queue=1)
        _shrink_bus_side(h, "tg:42")
        conn = h.bus.peers["tg:42"]
        closed = asyncio.create_task(conn.wait_closed())
        ping = frame("ping")
        blocked = False
        for _ in range(50_000):
            try:
                async with asyncio.timeout(scaled(1)):
                    await ws.send(ping)
            except TimeoutError:
                blocked = True  # the bus stopped reading: TCP pushes back on the sender
                break
            except ConnectionClosed:
                break
            assert conn.requests_in_flight <= 8
        assert blocked or ws.close_code is not None
        async with asyncio.timeout(scaled(10)):
            await closed
        await h.log.commit()
        assert h.rows(event="slow_consumer", actor="tg:42", status="4004")
        await assert_bus_still_delivers(h, "after-flood")


async def test_bytes_in_flight_over_the_bus_limit_are_refused_with_32005(tmp_path):
    """A request that would take the bus over max_inflight_bytes gets -32005 at once."""
    limits = Limits(max_inflight_bytes=50_000, process_timeout=30)
    async with running_bus(tmp_path, limits=limits) as h:
        started, release = asyncio.Event(), asyncio.Event()

        async def hold(message: Message) -> None:
            started.set()
            await release.wait()

        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, hold)
            first = asyncio.create_task(
                tg.send("agent:w1", "tg_message", {"text": "x" * 30_000}, message_id="a")
            )
            ws = await initialized(h, "tg:43")
            try:
                async with asyncio.timeout(scaled(5)):
                    await started.wait()  # the first 30 kB request is now in flight
                params = send_params("b", {"text": "y" * 30_000})
                params["payload"]["from"] = "tg:43"
                reply = await answer(ws, frame("sendMessage", params))
                assert reply["error"]["code"] == -32005
                assert "max_inflight_bytes" in reply["error"]["message"]
            finally:
                await ws.close()
            release.set()
            assert (await first).delivered_to == 1


# 3. Connections: anonymous sockets cannot lock peers out.


async def test_anonymous_sockets_per_address_cannot_lock_out_other_addresses(tmp_path):
    """Idle anonymous sockets from one address at max_anonymous_per_address: a peer from
    another address still connects and initializes, and evicts no one."""
    limits = Limits(max_anonymous_per_address=3)
    async with running_bus(tmp_path, limits=limits) as h:
        idle = [await connect(h.url) for _ in range(3)]
        try:
            other = socket.create_connection(
                ("127.0.0.1", h.bus.port), source_address=("127.0.0.2", 0)
            )
            ws = await initialized(h, "tg:42", sock=other)
            assert (await answer(ws, frame("ping")))["result"]["pong"] is True
            await ws.close()
            assert all(ws.close_code is None for ws in idle)
        finally:
            for ws in idle:
                await ws.close()
        assert await h.refused() == {}


async def closed_with(ws: ClientConnection) -> tuple[int | None, str | None]:
    async with asyncio.timeout(scaled(5)):
        await ws.wait_closed()
    return ws.close_code, ws.close_reason


async def test_a_full_anonymous_cap_evicts_its_oldest_socket(tmp_path):
    """One more anonymous socket from an address at max_anonymous_per_address closes the
    oldest of them (4006, counted in ws_refused as evicted: the newcomer is not refused) instead
    of being refused, so a flood of sockets from a shared address cannot lock a tool of that
    address out."""
    limits = Limits(max_anonymous_per_address=3)
    async with running_bus(tmp_path, limits=limits) as h:
        idle = [await connect(h.url) for _ in range(3)]
        try:
            ws = await initialized(h, "tg:42")  # the fourth: the first is evicted
            code, reason = await closed_with(idle[0])
            assert code == 4006 and reason is not None and "evicted" in reason
            assert all(ws.close_code is None for ws in idle[1:])
            assert (await answer(ws, frame("ping")))["result"]["pong"] is True
            idle.append(await connect(h.url))  # the third again: tg:42 no longer counts
            assert all(ws.close_code is None for ws in idle[1:])
            idle.append(await connect(h.url))  # one more: the oldest left goes
            assert (await closed_with(idle[1]))[0] == 4006
            assert all(ws.close_code is None for ws in idle[2:])
            await ws.close()
        finally:
            for ws in idle:
                await ws.close()
        assert await h.refused() == {"evicted": 2}


async def test_an_initialize_under_way_is_not_evicted(tmp_path, monkeypatch):
    """At a full per-address cap the oldest socket whose initialize is still being carried out
    is passed over for the next oldest; when every one has an initialize under way, the new
    socket gets HTTP 503 instead."""
    limits = Limits(max_anonymous_per_address=2)
    async with running_bus(tmp_path, limits=limits) as h:
        release, joining = asyncio.Event(), asyncio.Event()
        join = h.bus.join

        async def slow_join(*args: Any, **kwargs: Any) -> Any:
            joining.set()
            await release.wait()
            return await join(*args, **kwargs)

        monkeypatch.setattr(h.bus, "join", slow_join)
        busy = await connect(h.url)
        idle = await connect(h.url)
        sockets = [busy, idle]
        try:
            params = {"clientId": "tg:42", "auth": {"token": h.token("tg:42")}}
            await busy.send(frame("initialize", params))
            async with asyncio.timeout(scaled(5)):
                await joining.wait()
            sockets.append(await connect(h.url))  # the idle one goes, not the older busy one
            assert (await closed_with(idle))[0] == 4006
            assert busy.close_code is None
            joining.clear()
            other = {"clientId": "agent:w1", "auth": {"token": h.token("agent:w1")}}
            await sockets[2].send(frame("initialize", other))
            async with asyncio.timeout(scaled(5)):
                await joining.wait()
            with pytest.raises(InvalidStatus) as caught:
                await connect(h.url)  # both left are initializing: none can be evicted
            assert caught.value.response.status_code == 503
            release.set()
            async with asyncio.timeout(scaled(5)):
                assert "result" in json.loads(await busy.recv())
        finally:
            release.set()
            for ws in sockets:
                await ws.close()
        assert await h.refused() == {"evicted": 1, "max_anonymous_per_address": 1}


async def test_a_peer_with_its_token_at_the_handshake_passes_a_full_anonymous_cap(tmp_path):
    """Anonymous sockets fill their address's cap; a peer from that address that sends its
    token as Authorization: Bearer at the handshake connects without evicting any of them."""
    limits = Limits(max_anonymous_per_address=3)
    async with running_bus(tmp_path, limits=limits) as h:
        idle = [await connect(h.url) for _ in range(3)]
        try:
            async with h.peer("tg:42", auth_header=True, reconnect=False) as peer:
                assert (await peer.ping()).pong is True
            assert all(ws.close_code is None for ws in idle)
        finally:
            for ws in idle:
                await ws.close()
        assert await h.refused() == {}


async def test_a_socket_with_a_peers_token_at_the_handshake_is_never_evicted(tmp_path):
    """A peer's socket that sent its token at the handshake and has not initialized yet is
    passed over when anonymous sockets from its address evict: they cannot kick it out."""
    limits = Limits(max_anonymous_per_address=2)
    async with running_bus(tmp_path, limits=limits) as h:
        token = h.token("tg:42")
        peer = await connect(h.url, additional_headers={"Authorization": f"Bearer {token}"})
        sockets = [peer, await connect(h.url)]
        try:
            sockets.append(await connect(h.url))  # the cap is full: the anonymous one goes
            assert (await closed_with(sockets[1]))[0] == 4006
            assert peer.close_code is None
            params = {"clientId": "tg:42", "auth": {"token": token}}
            assert "result" in await answer(peer, frame("initialize", params))
        finally:
            for ws in sockets:
                await ws.close()


async def test_the_total_anonymous_cap_still_refuses_with_503(tmp_path):
    """With max_anonymous_connections full and no per-address cap reached, one more socket is
    refused with HTTP 503, as before: eviction is for one address's flood only."""
    limits = Limits(max_anonymous_connections=2, max_anonymous_per_address=5)
    async with running_bus(tmp_path, limits=limits) as h:
        idle = [await connect(h.url) for _ in range(2)]
        try:
            with pytest.raises(InvalidStatus) as caught:
                await connect(h.url)
            assert caught.value.response.status_code == 503
            assert all(ws.close_code is None for ws in idle)
        finally:
            for ws in idle:
                await ws.close()
        assert await h.refused() == {"max_anonymous_connections": 1}


async def test_initialized_sockets_leave_the_anonymous_count(tmp_path):
    """Peers that initialized do not count against max_anonymous_connections."""
    async with running_bus(tmp_path, limits=Limits(max_anonymous_connections=2)) as h:
        peers = [await initialized(h, f"tg:{n}") for n in range(5)]
        try:
            assert len(h.bus.peers) == 5
        finally:
            for ws in peers:
                await ws.close()


# 4. The log fails closed for everyone.


async def test_log_failure_delivers_nothing_and_a_retry_delivers_once(tmp_path, monkeypatch):
    """When the log cannot commit, a plain (non-BCP) message gets -32006 and reaches nobody; the
    same messageId sent again once the log is back is delivered exactly once."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, inbox)
            real_commit = h.log.commit

            async def failing_commit() -> None:
                raise AuditUnavailable("disk full")

            monkeypatch.setattr(h.log, "commit", failing_commit)
            with pytest.raises(AuditUnavailable):
                await tg.send("agent:w1", "tg_message", {"n": 1}, message_id="once")
            assert inbox.empty()
            monkeypatch.setattr(h.log, "commit", real_commit)
            result = await tg.send("agent:w1", "tg_message", {"n": 1}, message_id="once")
            assert result.delivered_to == 1
            assert (await inbox.get()).content == {"n": 1}
            assert inbox.empty()


async def test_a_full_log_backlog_still_answers_the_request(tmp_path):
    """With the log's backlog full (record() refuses every row), a sendMessage is answered
    -32006 at once, though its rpc_error row cannot be kept either: it is never left without
    an answer."""
    async with running_bus(tmp_path) as h:
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
            agent.handle(None, Inbox())
            queue_max, h.log.queue_max = h.log.queue_max, 0  # as if that many rows waited
            try:
                async with asyncio.timeout(scaled(5)):
                    with pytest.raises(AuditUnavailable, match="backlog is full"):
                        await tg.send("agent:w1", "tg_message", {"n": 1})
            finally:
                h.log.queue_max = queue_max
            assert (await tg.send("agent:w1", "tg_message", {"n": 2})).delivered_to == 1


@contextlib.asynccontextmanager
async def closing_with_a_send_in_flight(
    h: BusHarness, release: asyncio.Event
) -> AsyncIterator[tuple[ClientConnection, asyncio.Task[None]]]:
    """A raw peer's sendMessage (id 1) held by a subscriber until ``release``, and the bus's
    close() started meanwhile; yields the socket and the closing task."""
    started = asyncio.Event()

    async def held(message: Message) -> None:
        started.set()
        await release.wait()

    async with h.peer("agent:w1") as agent:
        agent.handle(None, held)
        ws = await initialized(h, "tg:42")
        await ws.send(frame("sendMessage", send_params("m-1", {"n": 1}), request_id=1))
        async with asyncio.timeout(scaled(5)):
            await started.wait()
        closing = asyncio.create_task(h.bus.close())
        try:
            yield ws, closing
        finally:
            release.set()


async def assert_closed_with_1001(ws: ClientConnection) -> None:
    with pytest.raises(ConnectionClosed) as caught:
        async with asyncio.timeout(scaled(5)):
            await ws.recv()
    assert caught.value.rcvd is not None and caught.value.rcvd.code == 1001


async def test_requests_in_flight_at_close_get_their_answer(tmp_path):
    """Closing the bus answers the request in flight with its result, and one sent meanwhile
    with -32007, before the connections close with 1001."""
    async with running_bus(tmp_path) as h:
        release = asyncio.Event()
        async with closing_with_a_send_in_flight(h, release) as (ws, closing):
            reply = await answer(ws, frame("ping", request_id=2))
            assert reply["id"] == 2 and reply["error"]["code"] == -32007
            release.set()
            async with asyncio.timeout(scaled(5)):
                reply = json.loads(await ws.recv())
            assert reply["id"] == 1 and reply["result"]["deliveredTo"] == 1
            await assert_closed_with_1001(ws)
            await closing


async def test_requests_still_unanswered_after_the_grace_get_32007(tmp_path):
    """A request whose delivery outlasts shutdown_grace is answered -32007 (saying it may have
    been carried out) before the connection closes with 1001."""
    async with running_bus(tmp_path, limits=Limits(shutdown_grace=0.2)) as h:
        async with closing_with_a_send_in_flight(h, asyncio.Event()) as (ws, closing):
            async with asyncio.timeout(scaled(5)):
                reply = json.loads(await ws.recv())
            assert reply["id"] == 1 and reply["error"]["code"] == -32007
            assert "may have been carried out" in reply["error"]["message"]
            await assert_closed_with_1001(ws)
            async with asyncio.timeout(scaled(5)):
                await closing


async def test_a_refusal_whose_row_outlasts_the_grace_is_still_answered_32007(
    tmp_path, monkeypatch
):
    """A request refused while its error row is still being committed when shutdown_grace
    ends gets -32007 before the connection closes, not silence."""
    async with running_bus(tmp_path, limits=Limits(shutdown_grace=0.2)) as h:
        committing, never = asyncio.Event(), asyncio.Event()

        async def stuck(*args: Any) -> None:
            committing.set()
            await never.wait()  # a log that is slow to commit (a disk retrying)

        monkeypatch.setattr(h.bus, "record_error", stuck)
        ws = await initialized(h, "tg:42")
        try:
            await ws.send(frame("noSuchMethod", {}, request_id=7))
            async with asyncio.timeout(scaled(5)):
                await committing.wait()
            closing = asyncio.create_task(h.bus.close())
            async with asyncio.timeout(scaled(5)):
                reply = json.loads(await ws.recv())
            assert reply["id"] == 7 and reply["error"]["code"] == -32007
            async with asyncio.timeout(scaled(5)):
                await closing
        finally:
            await ws.close()


# 5. Duplicate messageIds.


async def test_duplicate_message_id_is_refused_with_32008(tmp_path):
    """The same (from, messageId) within the window is refused with -32008 and a row; another
    sender may use the same id."""
    async with running_bus(tmp_path) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg, h.peer("tg:43") as other:
            agent.handle(None, inbox)
            await tg.send("agent:w1", "tg_message", {"n": 1}, message_id="dup")
            ws = await initialized(h, "tg:44")
            try:
                params = send_params("dup", {"n": 2})
                params["payload"]["from"] = "tg:44"
                assert "result" in await answer(ws, frame("sendMessage", params))
                reply = await answer(ws, frame("sendMessage", params, request_id=2))
                assert reply["error"]["code"] == -32008
                assert reply["error"]["data"] == {"messageId": "dup"}
            finally:
                await ws.close()
            assert (
                await other.send("agent:w1", "tg_message", {"n": 3}, message_id="dup")
            ).delivered_to == 1
        contents = [message.content for message in inbox.messages]
        assert contents == [{"n": 1}, {"n": 2}, {"n": 3}]
        assert h.rows(event="refused", status="duplicate", actor="tg:44")


async def test_sdk_peer_sees_duplicate_as_an_error(tmp_path):
    """The SDK raises the -32008 error for a resent messageId."""
    async with running_bus(tmp_path) as h:
        async with h.peer("agent:w1"), h.peer("tg:42") as tg:
            await tg.send("agent:w1", "tg_message", {"n": 1}, message_id="again")
            with pytest.raises(Exception) as caught:
                await tg.send("agent:w1", "tg_message", {"n": 1}, message_id="again")
            assert getattr(caught.value, "code", None) == -32008


async def test_deleted_database_stops_acknowledging(tmp_path):
    """Once the log's file is deleted under a running bus, sendMessage gets -32006 saying so,
    the subscriber receives nothing, and closing the log reports the rows it could not write."""
    with pytest.raises(AuditUnavailable, match="unwritten"):
        async with running_bus(tmp_path) as h:
            inbox = Inbox()
            async with h.peer("agent:w1") as agent, h.peer("tg:42") as tg:
                agent.handle(None, inbox)
                assert (await tg.send("agent:w1", "tg_message", {"n": 1})).delivered_to == 1
                await inbox.get()
                for suffix in ("", "-wal", "-shm"):
                    h.db.with_name(h.db.name + suffix).unlink(missing_ok=True)
                with pytest.raises(AuditUnavailable, match="deleted"):
                    await tg.send("agent:w1", "tg_message", {"n": 2})
                assert inbox.empty()
                assert (await tg.ping()).pong is True  # writes no rows: still answered
