"""The HTTP binding end to end: a real bus with its HTTP port, real HTTP clients, real webhooks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.routing import Route
from websockets.asyncio.client import connect

from bus.core import errors as bus_errors
from bus.core.errors import (
    AuditUnavailable,
    AuthenticationFailed,
    ContentNotKept,
    DuplicateMessage,
    EpochNotKept,
    Forbidden,
    InvalidParams,
    LimitExceeded,
    NotInitialized,
    ParseError,
    RemoteError,
    SubscriptionNotFound,
)
from bus.log.audit import bits_per_channel
from bus.ops.config import HttpSettings, Limits
from bus.transports.http import BodyTimeout, BodyTooLarge
from peers import Peer
from peers.testing import Inbox, running_bcp, running_bus, scaled
from schemas.bcp import BcpResponseDelivery
from schemas.bus import DeliveryStatus
from schemas.http import ROUTES

from .webhook_receiver import Receiver

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def settings(**changes: Any) -> HttpSettings:
    """Port 0 and webhooks quick enough for a test: short timeout, tiny backoff."""
    values: dict[str, Any] = {
        "port": 0,
        "webhook_timeout": scaled(1.0),
        "webhook_attempts": 3,
        "webhook_backoff": 0.01,
        "allow_private_webhooks": True,  # the receivers listen on 127.0.0.1
    }
    values.update(changes)
    return HttpSettings(**values)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def wait_for_rows(h: Any, count: int = 1, **where: Any) -> list[dict[str, Any]]:
    """The committed rows matching ``where`` once there are ``count`` of them."""
    rows: list[dict[str, Any]] = []
    async with asyncio.timeout(scaled(10)):
        while len(rows := h.rows(**where)) < count:
            await h.log.commit()
            await asyncio.sleep(0.02)
    return rows


async def test_an_http_only_peer_and_a_websocket_peer_talk_both_ways(tmp_path):
    """tg:42 posts over HTTP and is answered through its webhook; agent:w1 is on a WebSocket."""
    async with running_bus(tmp_path, http=settings()) as h:
        async with Receiver(secret="") as receiver:
            token, receiver.secret = await h.webhook_peer("tg:42", receiver.url)
            inbox = Inbox()
            async with h.peer("agent:w1") as agent, httpx.AsyncClient(base_url=h.http_url) as c:
                agent.handle(None, inbox)
                posted = await c.post(
                    "/v1/messages",
                    json={"topic": "agent:w1", "type": "tg_message", "content": {"text": "hi"}},
                    headers=bearer(token),
                )
                assert posted.status_code == 202, posted.text
                message_id = posted.json()["messageId"]
                assert posted.headers["x-request-id"].startswith("http-")
                delivered = await inbox.get()
                assert delivered.message_id == message_id and delivered.sender == "tg:42"
                assert delivered.content == {"text": "hi"}

                # The other way: the WebSocket peer answers; the bus POSTs it to the webhook.
                result = await agent.send("tg:42", "tg_reply", {"text": "hello"}, message_id="r-1")
                assert result.delivered_to == 1
                post = await asyncio.wait_for(receiver.received.get(), scaled(5))
                assert post.signed and post.fresh
                assert post.message["method"] == "processMessage"
                assert post.message["params"]["payload"]["messageId"] == "r-1"
                assert post.message["params"]["topic"] == "tg:42"

                # ?wait=true answers the sendMessage result once delivered.
                waited = await c.post(
                    "/v1/messages?wait=true",
                    json={"topic": "agent:w1", "type": "tg_message", "content": {"n": 2}},
                    headers=bearer(token),
                )
                assert waited.status_code == 200
                assert waited.json()["accepted"] is True and waited.json()["deliveredTo"] == 1
        rows = await wait_for_rows(h, message_id=message_id, event="send_finish")
        start = h.rows(message_id=message_id, event="send_start")[0]
        assert start["actor"] == "tg:42" and start["rpc_id"] == posted.headers["x-request-id"]
        assert rows[0]["status"] == "delivered 1/1"
        finish = h.rows(message_id="r-1", event="process_finish")[0]
        assert finish["actor"] == "tg:42" and finish["status"] == "processed"


async def test_a_webhook_that_fails_then_times_out_then_answers_gets_the_message(tmp_path):
    """A 500, then no answer within webhook_timeout, then an answer: delivered, two retry rows."""
    async with running_bus(tmp_path, http=settings(webhook_timeout=scaled(0.5))) as h:
        async with Receiver(secret="", script=["500", "hang", "ok"]) as receiver:
            _, receiver.secret = await h.webhook_peer("tg:42", receiver.url)
            async with h.peer("agent:w1") as agent:
                result = await agent.send("tg:42", "tg_reply", {"text": "x"}, message_id="m-1")
        assert result.delivered_to == 1
        assert len(receiver.posts) == 3
        assert all(post.signed and post.fresh for post in receiver.posts)
        assert len({post.body for post in receiver.posts}) == 1  # the same request each time
        retries = h.rows(message_id="m-1", event="webhook_retry")
        assert [row["status"] for row in retries] == ["http_500", "timeout"]
        assert h.rows(message_id="m-1", event="process_finish")[0]["status"] == "processed"
        assert h.rows(event="delivery_failed") == []


async def test_the_sender_gets_delivery_status_when_the_webhook_never_answers(tmp_path):
    """After the last attempt fails the sender gets delivery_status and a row is logged."""
    async with running_bus(tmp_path, http=settings()) as h:
        async with Receiver(secret="", script=["503"]) as receiver:
            _, receiver.secret = await h.webhook_peer("tg:42", receiver.url)
            inbox = Inbox()
            async with h.peer("agent:w1") as agent:
                agent.handle(None, inbox)
                result = await agent.send("tg:42", "tg_reply", {"text": "x"}, message_id="m-2")
                assert result.delivered_to == 0
                status = await inbox.get_type("delivery_status")
        assert status.sender == "system:bus" and status.topic == "agent:w1"
        content = DeliveryStatus.model_validate(status.content)
        assert content.message_id == "m-2" and content.target == "tg:42"
        assert content.reason == "http_error" and content.attempts == 3
        assert content.http_status == 503  # tg:42 is no more tainted than agent:w1
        assert status.payload["correlationId"] == "m-2"
        assert len(receiver.posts) == 3
        failed = h.rows(message_id="m-2", event="delivery_failed")
        assert len(failed) == 1 and failed[0]["actor"] == "tg:42"
        assert failed[0]["status"] == "http_503"
        finish = h.rows(message_id="m-2", event="process_finish")[0]
        assert finish["status"] == "error" and "http_503" in finish["error"]


async def test_a_webhook_that_cannot_be_reached_or_answers_garbage_fails_cleanly(tmp_path):
    """A closed port is retried as connect_error; a 200 that is not JSON-RPC is final."""
    async with running_bus(tmp_path, http=settings()) as h:
        await h.webhook_peer("tg:1", "http://127.0.0.1:9/nobody")
        async with Receiver(secret="", script=["garbage"]) as receiver:
            _, receiver.secret = await h.webhook_peer("tg:2", receiver.url)
            async with h.peer("agent:w1") as agent:
                first = await agent.send("tg:1", "tg_reply", {}, message_id="c-1")
                second = await agent.send("tg:2", "tg_reply", {}, message_id="c-2")
        assert first.delivered_to == second.delivered_to == 0
        assert len(receiver.posts) == 1  # a malformed answer is not retried
        failures = {row["message_id"]: row["status"] for row in h.rows(event="delivery_failed")}
        assert failures == {"c-1": "connect_error", "c-2": "malformed_response"}


async def test_metrics_are_prometheus_text_with_connections_deliveries_errors_and_bits(tmp_path):
    """GET /metrics parses with prometheus_client's parser and counts what happened."""
    async with running_bcp(tmp_path, http=settings()) as h:
        main, reader = h.controller("main"), h.reader("researcher")
        reader.on_query(_answer_cat1)
        await main.start()
        await reader.start()
        try:
            delivery = await main.ask("researcher", CAT1, query_id="mq1", timeout=scaled(10))
            assert isinstance(delivery, BcpResponseDelivery)
            async with httpx.AsyncClient(base_url=h.bus.http_url) as c:
                online = _samples((await c.get("/metrics")).text)
                await h.gateway.close()  # its settling rows come after the delivery
                await h.bus.log.commit()
                charged = bits_per_channel(h.bus.db)
                refused = await c.post("/v1/messages", json={}, headers=bearer("nope"))
                assert refused.status_code == 401
                samples = _samples((await c.get("/metrics")).text)
        finally:
            await reader.close()
            await main.close()
    assert online[("bcpbus_connections", (("role", "controller"),))] == 1
    assert online[("bcpbus_connections", (("role", "gateway"),))] == 1
    assert online[("bcpbus_peers", (("link", "local"),))] == 1  # the gateway, in-process
    assert online[("bcpbus_peers", (("link", "websocket"),))] == 2
    assert samples[("bcpbus_messages_total", ())] >= 5  # a query is five messages
    assert samples[("bcpbus_deliveries_total", (("status", "processed"),))] >= 5
    assert samples[("bcpbus_http_refused_total", (("reason", "unknown_token"),))] == 1
    assert samples[("bcpbus_process_message_seconds_count", ())] >= 5
    assert samples[("bcpbus_log_commit_seconds_count", ())] >= 5
    bits = samples[("bcpbus_bcp_bits_charged", (("channel", "bcp:main:researcher"),))]
    assert charged[0]["channel"] == "bcp:main:researcher"
    net = charged[0]["charged"] - charged[0]["refunded"]  # what the budget paid
    assert bits == pytest.approx(net) and bits > 0


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition, parsed by prometheus_client."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


CAT1 = {"category": 1, "fields": [{"name": "has_pricing", "type": "boolean"}]}


async def _answer_cat1(query: dict[str, Any]) -> Any:
    return {"has_pricing": True}


async def test_http_errors_have_statuses_json_rpc_bodies_and_rows(tmp_path):
    """Each refusal answers its status and JSON-RPC error, and logs rpc_error like a socket;
    an anonymous one (no token, a wrong one) is counted into one http_refused row instead."""
    limits = Limits(max_frame_bytes=2000)
    async with running_bus(tmp_path, http=settings(), limits=limits) as h:
        token = h.token("tg:42")
        ok = {"topic": "agent:w1", "type": "tg_message", "content": {}}
        cases: list[tuple[dict[str, Any], int, int]] = [
            ({"json": ok}, 401, -32002),
            ({"json": ok, "headers": bearer("bcpbus_wrong")}, 401, -32002),
            ({"content": b"{", "headers": bearer(token)}, 400, -32700),
            ({"json": [1], "headers": bearer(token)}, 400, -32602),
            ({"json": {**ok, "extra": 1}, "headers": bearer(token)}, 400, -32602),
            ({"json": {**ok, "type": "spawn_result"}, "headers": bearer(token)}, 403, -32602),
            ({"json": {**ok, "topic": "agent:*"}, "headers": bearer(token)}, 400, -32602),
            ({"json": {**ok, "content": {"x": "y" * 3000}}, "headers": bearer(token)}, 413, -32600),
            ({"json": ok, "headers": bearer(token), "params": {"wait": "maybe"}}, 400, -32602),
        ]
        async with httpx.AsyncClient(base_url=h.http_url) as c:
            for request, status, code in cases:
                response = await c.post("/v1/messages", **request)
                assert response.status_code == status, (request, response.text)
                assert response.json()["error"]["code"] == code
                rpc_id = response.headers["x-request-id"]
                rows = h.rows(rpc_id=rpc_id, event="rpc_error")
                assert [r["status"] for r in rows] == ([] if status == 401 else [str(code)])
            assert response.status_code == 400
            unauthorized = await c.post("/v1/messages", json=ok)
            assert unauthorized.headers["www-authenticate"] == "Bearer"
            # A retry with the same messageId inside dedup_window is 409.
            body = {**ok, "messageId": "dup-1"}
            assert (
                await c.post("/v1/messages", json=body, headers=bearer(token))
            ).status_code == 202
            again = await c.post("/v1/messages", json=body, headers=bearer(token))
            assert again.status_code == 409 and again.json()["error"]["code"] == -32008
        assert h.rows(event="frame_too_large")[0]["actor"] == "tg:42"
        assert [r["status"] for r in h.rows(event="refused")] == ["type_denied", "duplicate"]
    assert h.rows(event="auth_failed") == []
    (row,) = h.rows(event="http_refused")  # written when the binding closed
    counts = json.loads(row["payload_json"])
    assert counts["reasons"] == {"no_credential": 2, "unknown_token": 1}
    assert {"address": "127.0.0.1", "reason": "no_credential", "count": 2} in counts["addresses"]


def test_each_bus_error_has_an_http_status():
    """Policy refusals are 403, limits 429, an unavailable log 503, unknown codes 500."""
    assert Forbidden().http_status == 403
    assert InvalidParams().http_status == 400
    assert ParseError().http_status == 400
    assert AuthenticationFailed().http_status == 401
    assert SubscriptionNotFound().http_status == 404
    assert NotInitialized().http_status == 409
    assert DuplicateMessage().http_status == 409
    assert LimitExceeded().http_status == 429
    assert AuditUnavailable().http_status == 503
    assert EpochNotKept().http_status == ContentNotKept().http_status == 410
    assert RemoteError(-32050, "a code this bus does not know").http_status == 500
    assert BodyTooLarge().http_status == 413 and BodyTimeout().http_status == 408


async def test_a_traceparent_header_is_checked_and_kept_on_the_envelope(tmp_path):
    """A valid header lands on the envelope; a malformed or contradicted one is 400."""
    async with running_bus(tmp_path, http=settings()) as h:
        token = h.token("tg:42")
        inbox = Inbox()
        async with h.peer("agent:w1") as agent, httpx.AsyncClient(base_url=h.http_url) as c:
            agent.handle(None, inbox)
            body = {"topic": "agent:w1", "type": "tg_message", "content": {}}
            kept = await c.post(
                "/v1/messages", json=body, headers={**bearer(token), "traceparent": TRACE}
            )
            assert kept.status_code == 202
            assert (await inbox.get()).payload["traceparent"] == TRACE
            for bad in ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", "x"):
                refused = await c.post(
                    "/v1/messages", json=body, headers={**bearer(token), "traceparent": bad}
                )
                assert refused.status_code == 400, bad
            zeros = f"00-{'0' * 32}-b7ad6b7169203331-01"
            refused = await c.post(
                "/v1/messages", json=body, headers={**bearer(token), "traceparent": zeros}
            )
            assert "all zeros" in refused.json()["error"]["message"]
            other = TRACE.replace("01", "00")
            mismatch = await c.post(
                "/v1/messages",
                json={**body, "traceparent": other},
                headers={**bearer(token), "traceparent": TRACE},
            )
            assert mismatch.status_code == 400 and "differ" in mismatch.json()["error"]["message"]
        start = h.rows(message_id=kept.json()["messageId"], event="send_start")[0]
        assert json.loads(start["payload_json"])["traceparent"] == TRACE


async def test_a_sender_online_on_a_websocket_never_gets_its_own_http_message(tmp_path):
    """Posting over HTTP as a connected peer acts as that peer: no delivery back to itself."""
    async with running_bus(tmp_path, http=settings()) as h:
        inbox = Inbox()
        async with h.peer("agent:w1") as w1, h.peer("agent:w2") as w2:
            w1.handle(None, inbox)
            w2.handle(None, Inbox())
            token = h.token("agent:w1")  # rotated: the connection stays, HTTP uses the new token
            async with httpx.AsyncClient(base_url=h.http_url) as c:
                answer = await c.post(
                    "/v1/messages?wait=true",
                    json={"topic": "agent:w1", "type": "agent_event", "content": {}},
                    headers=bearer(token),
                )
        assert answer.status_code == 200 and answer.json()["deliveredTo"] == 0
        assert inbox.empty()


async def test_a_webhook_peer_subscribes_over_http_and_cannot_open_a_websocket(tmp_path):
    """POST/DELETE /v1/subscriptions work for a webhook peer; initialize as it is refused."""
    async with running_bus(tmp_path, http=settings()) as h:
        async with Receiver(secret="") as receiver:
            token, receiver.secret = await h.webhook_peer(
                "agent:hook", receiver.url, subscriptions=["agent:hook"]
            )
            async with httpx.AsyncClient(base_url=h.http_url) as c:
                denied = await c.post(
                    "/v1/subscriptions", json={"topic": "bcp:*"}, headers=bearer(token)
                )
                assert denied.status_code == 403
                gone = await c.request(
                    "DELETE", "/v1/subscriptions", params={"topic": "x:y"}, headers=bearer(token)
                )
                assert gone.status_code == 404 and gone.json()["error"]["code"] == -32003
                offline = h.token("agent:offline")
                nowhere = await c.post(
                    "/v1/subscriptions", json={"topic": "agent:offline"}, headers=bearer(offline)
                )
                assert nowhere.status_code == 409 and "webhook" in nowhere.text
            with pytest.raises(AuthenticationFailed, match="webhook"):
                await Peer(h.url, "agent:hook", token, reconnect=False).connect()
            async with h.peer("agent:w1") as w1:
                result = await w1.send("agent:hook", "agent_event", {}, message_id="e-1")
                assert result.delivered_to == 1
        assert [r["status"] for r in h.rows(actor="agent:hook", event="auth_failed")] == ["webhook"]


async def test_discovery_openapi_and_health_describe_this_bus(tmp_path):
    """The well-known document names the endpoints; /openapi.json is OpenAPI 3.1."""
    async with running_bus(tmp_path, http=settings()) as h:
        async with httpx.AsyncClient(base_url=h.http_url) as c:
            discovery = (await c.get("/.well-known/bcpbus")).json()
            document = (await c.get("/openapi.json")).json()
            health = await c.get("/healthz")
        ws_url, http_url = h.url, h.http_url
    assert discovery["endpoints"]["websocket"] == ws_url
    assert discovery["endpoints"]["http"] == http_url
    assert "sendMessage" in discovery["methods"] and discovery["capabilities"]["webhooks"]
    assert discovery["limits"]["max_frame_bytes"] == Limits().max_frame_bytes
    assert document["openapi"] == "3.1.0" and document["servers"] == [{"url": http_url}]
    assert set(document["paths"]) >= {"/v1/messages", "/.well-known/bcpbus", "/metrics"}
    assert set(document["paths"]["/v1/messages"]) == {"get", "post"}
    assert discovery["capabilities"]["epochs"] and "fetchMessages" in discovery["methods"]
    assert health.text == "ok\n"


async def test_the_routes_served_and_documented_are_the_one_table(tmp_path):
    """The binding serves each route of schemas.http.ROUTES, answers each, and /openapi.json
    documents each but itself, with the table's operationId; the error statuses each names
    are ones some bus error answers."""
    async with running_bus(tmp_path, http=settings()) as h:
        served = {
            (route.path, method)
            for route in h.http.app.routes
            if isinstance(route, Route)
            for method in route.methods or ()
            if method != "HEAD"
        }
        async with httpx.AsyncClient(base_url=h.http_url) as c:
            answers = {op.operation_id: await c.request(op.method, op.path) for op in ROUTES}
            document = (await c.get("/openapi.json")).json()
    assert served == {(op.path, op.method) for op in ROUTES}
    assert all(answer.status_code not in (404, 405) for answer in answers.values()), answers
    documented = {
        (path, method.upper()): operation["operationId"]
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    }
    assert documented == {(op.path, op.method): op.operation_id for op in ROUTES if op.documented}
    statuses = {
        cls.http_status
        for cls in vars(bus_errors).values()
        if isinstance(cls, type) and issubclass(cls, bus_errors.BusError)
    }
    # 413 is the binding's own BodyTooLarge, an InvalidRequest that bus.core.errors lacks.
    assert {code for op in ROUTES for code in op.errors} <= {str(s) for s in statuses} | {"413"}


async def test_a_websocket_bearer_header_still_works_beside_http(tmp_path):
    """The WebSocket handshake is untouched by the HTTP binding on its own port."""
    async with running_bus(tmp_path, http=settings()) as h:
        token = h.token("agent:w1")
        async with connect(h.url, additional_headers=bearer(token)) as ws:
            await ws.send(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "initialize",
                        "params": {"clientId": "agent:w1"},
                    }
                )
            )
            answer = json.loads(await asyncio.wait_for(ws.recv(), scaled(5)))
        assert "result" in answer
        assert h.http is not None and h.http.port != h.bus.port


async def test_messages_still_being_delivered_are_bounded_by_max_requests(tmp_path):
    """Past max_requests accepted-but-undelivered messages a POST is 429; then it frees up."""
    async with running_bus(tmp_path, http=settings(max_requests=1)) as h:
        release = asyncio.Event()
        seen = Inbox()

        async def slow(message: Any) -> None:
            await seen(message)
            await release.wait()

        token = h.token("tg:42")
        body = {"topic": "agent:w1", "type": "tg_message", "content": {}}
        async with h.peer("agent:w1") as agent, httpx.AsyncClient(base_url=h.http_url) as c:
            agent.handle(None, slow)
            first = await c.post("/v1/messages", json=body, headers=bearer(token))
            assert first.status_code == 202
            await seen.get()  # being delivered, held by the handler
            second = await c.post("/v1/messages", json=body, headers=bearer(token))
            assert second.status_code == 429 and second.json()["error"]["code"] == -32005
            release.set()
            await wait_for_rows(h, message_id=first.json()["messageId"], event="send_finish")
            # The held body's bytes are given back when the delivery ends, just after its row.
            async with asyncio.timeout(scaled(10)):
                assert h.http is not None
                await h.http.settled()
            assert h.bus.byte_budget.used == 0
            third = await c.post("/v1/messages", json=body, headers=bearer(token))
            assert third.status_code == 202
        assert h.rows(event="limit_exceeded")[0]["status"] == "http_max_requests"


async def test_an_http_only_peer_polls_what_it_may_read_page_by_page(tmp_path):
    """A peer with no socket and no webhook reads with GET /v1/messages: its own topic's
    messages after an epoch, oldest first, page by page through next, narrowed by the filters;
    the 202 of a post carries the epoch."""
    async with running_bus(tmp_path, http=settings()) as h:
        token = h.token("tg:42")
        async with h.peer("agent:w1") as agent, httpx.AsyncClient(base_url=h.http_url) as c:
            posted = await c.post(
                "/v1/messages",
                json={"topic": "agent:w1", "type": "tg_message", "content": {}},
                headers=bearer(token),
            )
            assert posted.status_code == 202
            start = h.rows(message_id=posted.json()["messageId"], event="send_start")[0]
            assert posted.json()["epoch"] == start["epoch"]
            replies = [
                await agent.send("tg:42", "tg_reply", {"n": n}, correlation_id=f"c{n % 2}")
                for n in range(3)
            ]
            assert [r.delivered_to for r in replies] == [0, 0, 0]  # tg:42 is not online
            query = {"topic": "tg:42", "since": posted.json()["epoch"], "limit": 2}
            first = await c.get("/v1/messages", params=query, headers=bearer(token))
            assert first.status_code == 200, first.text
            page = first.json()
            assert [m["epoch"] for m in page["messages"]] == [r.epoch for r in replies[:2]]
            assert page["more"] is True and page["next"].startswith("/v1/messages?")
            rest = (await c.get(page["next"], headers=bearer(token))).json()
            assert [m["payload"]["content"] for m in rest["messages"]] == [{"n": 2}]
            assert rest["more"] is False and rest["next"] is None
            narrowed = await c.get(
                "/v1/messages",
                params={"topic": "tg:42", "correlationId": "c0", "from": "agent:w1"},
                headers=bearer(token),
            )
            assert [m["payload"]["content"] for m in narrowed.json()["messages"]] == [
                {"n": 0},
                {"n": 2},
            ]
            before = await c.get(
                "/v1/messages",
                params={"topic": "tg:42", "until": "2000-01-01T00:00:00Z"},
                headers=bearer(token),
            )
            assert before.json()["messages"] == []
        assert h.rows(event="fetch", actor="tg:42")


async def test_get_messages_refusals_have_their_statuses(tmp_path):
    """A topic the policy does not grant is 403, an epoch the log does not cover 410, an unknown
    parameter 400; each error has its row."""
    async with running_bus(tmp_path, http=settings()) as h:
        token = h.token("tg:42")
        async with httpx.AsyncClient(base_url=h.http_url) as c:
            cases = [
                ({"topic": "agent:w1"}, 403),
                ({"topic": "tg:42", "since": h.bus.latest_epoch + 86_400_000_000}, 410),
                ({"topic": "tg:42", "color": "red"}, 400),
                ({"topic": "tg:42", "until": "yesterday"}, 400),
            ]
            for params, status in cases:
                answer = await c.get("/v1/messages", params=params, headers=bearer(token))
                assert answer.status_code == status, (params, answer.text)
            assert answer.json()["error"]["code"] == -32602
        await h.log.commit()
        assert len(h.rows(event="rpc_error", actor="tg:42")) == 4
