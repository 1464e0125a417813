"""The HTTP binding's limits against clients without a token: header and body timeouts, a cap
per address on anonymous connections, and refusals logged as counts, not one row each."""

from __future__ import annotations

import asyncio
import json

import httpx

from peers.testing import running_bus, scaled

from .test_http import bearer, settings

PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: bus\r\nX-Slow: "
"""Request headers that never end: a slowloris socket."""


async def closed_by_the_bus(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the bus closed this socket within ``seconds`` (EOF or reset), sending nothing."""
    try:
        async with asyncio.timeout(seconds):
            return await reader.read(1) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def slowloris(
    port: int, count: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    sockets = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PARTIAL)
        sockets.append((reader, writer))
    for _, writer in sockets:
        await writer.drain()
    return sockets


async def test_slowloris_sockets_from_one_address_lock_nobody_out(tmp_path):
    """200 sockets that never finish their headers, against a cap of 20 per address and 60
    connections in all: another address and a real peer on the same address are answered,
    every socket past the cap is closed at once, the rest when header_timeout ends."""
    http = settings(max_anonymous_per_address=20, max_connections=60, header_timeout=scaled(2))
    async with running_bus(tmp_path, http=http) as h:
        assert h.http is not None
        port = h.http.port
        token = h.token("tg:42")
        sockets = await slowloris(port, 200)
        try:
            assert h.http.guard.anonymous("127.0.0.1") <= 20
            other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
            async with httpx.AsyncClient(base_url=h.http_url, transport=other) as c:
                assert (await c.get("/healthz")).status_code == 200
            async with httpx.AsyncClient(base_url=h.http_url) as c:
                posted = await c.post(
                    "/v1/messages",
                    json={"topic": "agent:w1", "type": "tg_message", "content": {}},
                    headers=bearer(token),
                )
                assert posted.status_code == 202, posted.text
                closed = await asyncio.gather(
                    *(closed_by_the_bus(reader, scaled(10)) for reader, _ in sockets)
                )
            assert all(closed)
        finally:
            for _, writer in sockets:
                writer.close()
        total = h.http.refusals.total
        # Each socket is closed once: past the cap as it comes, or by the header timeout (the
        # last ones, and more if opening 200 took longer than header_timeout on a busy machine).
        assert total["anonymous_cap"] + total["header_timeout"] == 200
        assert total["anonymous_cap"] >= 100 and total["header_timeout"] >= 1
    payloads = [json.loads(row["payload_json"]) for row in h.rows(event="http_refused")]
    assert sum(p["reasons"].get("anonymous_cap", 0) for p in payloads) == total["anonymous_cap"]


async def test_a_request_whose_headers_or_body_crawl_is_cut_off(tmp_path):
    """Headers not in within header_timeout: the socket is closed. An authenticated body not in
    within body_timeout: 408 with Connection: close and a limit_exceeded row."""
    http = settings(header_timeout=scaled(0.5), body_timeout=scaled(0.5))
    async with running_bus(tmp_path, http=http) as h:
        assert h.http is not None
        token = h.token("tg:42")
        reader, writer = await asyncio.open_connection("127.0.0.1", h.http.port)
        writer.write(PARTIAL)
        assert await closed_by_the_bus(reader, scaled(5))
        writer.close()

        reader, writer = await asyncio.open_connection("127.0.0.1", h.http.port)
        head = (
            "POST /v1/messages HTTP/1.1\r\nHost: bus\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: 100\r\n\r\n"
        )
        writer.write(head.encode() + b'{"topic": ')
        async with asyncio.timeout(scaled(5)):
            answer = await reader.read()  # the bus answers, then closes
        writer.close()
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 408 Request Timeout", answer
        assert b"connection: close" in rest.lower()
        assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["code"] == -32600
        await h.log.commit()
        rows = h.rows(event="limit_exceeded", status="http_body_timeout")
        assert [r["actor"] for r in rows] == ["tg:42"]


async def test_an_idle_connection_is_closed_and_a_busy_one_is_not(tmp_path):
    """After a response a connection has header_timeout for its next request; a request being
    handled is not cut by it."""
    http = settings(header_timeout=scaled(0.5), keep_alive_timeout=60)
    async with running_bus(tmp_path, http=http) as h:
        assert h.http is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", h.http.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: bus\r\n\r\n")
        async with asyncio.timeout(scaled(5)):
            head = await reader.readuntil(b"ok\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert await closed_by_the_bus(reader, scaled(5))
        writer.close()
        assert h.http.refusals.total["header_timeout"] == 0  # an idle close is no refusal


async def test_five_hundred_anonymous_refusals_write_a_bounded_number_of_rows(tmp_path):
    """500 requests with no token or a wrong one: each answered 401, none with a row of its
    own; the log gets one http_refused row per interval with the counts."""
    async with running_bus(tmp_path, http=settings(refusal_log_interval=60.0)) as h:
        async with httpx.AsyncClient(base_url=h.http_url) as c:
            for number in range(500):
                headers = bearer(f"bcpbus_wrong{number}") if number % 2 else {}
                response = await c.get("/v1/messages?topic=x", headers=headers)
                assert response.status_code == 401
        await h.log.commit()
        assert h.rows(event="auth_failed") == h.rows(event="rpc_error") == []
    rows = h.rows(event="http_refused")
    assert len(rows) == 1  # one per interval (60 s here), and one when the binding stops
    payloads = [json.loads(row["payload_json"]) for row in rows]
    assert sum(p["total"] for p in payloads) == 500
    assert sum(p["reasons"].get("unknown_token", 0) for p in payloads) == 250


async def test_a_request_head_past_max_header_bytes_is_refused(tmp_path):
    """Headers that grow past max_header_bytes before they end are answered 400 and the
    connection closed: the bus never buffers more of a head than that."""
    async with running_bus(tmp_path, http=settings(max_header_bytes=4096)) as h:
        assert h.http is not None
        reader, writer = await asyncio.open_connection("127.0.0.1", h.http.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: bus\r\nX-Big: " + b"a" * 8192)
        async with asyncio.timeout(scaled(5)):
            answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400"), answer[:100]


async def test_requests_that_are_not_http_are_counted_not_logged_each(tmp_path, caplog):
    """Bytes that are not an HTTP request get 400; they are counted into http_refused and put
    no line of their own in the process's log."""
    async with running_bus(tmp_path, http=settings()) as h:
        assert h.http is not None
        for _ in range(50):
            reader, writer = await asyncio.open_connection("127.0.0.1", h.http.port)
            writer.write(b"\x16\x03\x01 not http\r\n\r\n")
            async with asyncio.timeout(scaled(5)):
                answer = await reader.read()
            writer.close()
            assert answer.startswith(b"HTTP/1.1 400")
        assert h.http.refusals.total["bad_request"] == 50
    assert "Invalid HTTP request" not in caplog.text
    (row,) = h.rows(event="http_refused")
    assert json.loads(row["payload_json"])["reasons"] == {"bad_request": 50}
