"""The console over plain HTTP against a real bus: headers, cookies, CSRF, who may sign in."""

from __future__ import annotations

import asyncio
import re

import httpx
from markupsafe import escape
from starlette.applications import Starlette
from starlette.routing import Mount

from peers.console import COOKIE, PATH, live
from peers.gateway.risk_command import check
from peers.testing import scaled

from .conftest import CAT3, rig


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None
    return found.group(1)


async def sign_in(client: httpx.AsyncClient, token: str) -> httpx.Response:
    page = await client.get("/signin")
    return await client.post("/signin", data={"csrf": csrf_of(page.text), "token": token})


async def test_every_response_carries_the_strict_headers(tmp_path):
    """Pages, redirects and static files all carry the CSP and the other security headers."""
    async with rig(tmp_path) as r, httpx.AsyncClient(base_url=r.url) as client:
        for path in ("/signin", "/approvals", "/static/console.css", "/static/nope.js"):
            response = await client.get(path)
            headers = response.headers
            assert headers["content-security-policy"].startswith("default-src 'self';")
            assert "unsafe-inline" not in headers["content-security-policy"]
            assert headers["x-frame-options"] == "DENY"
            assert headers["x-content-type-options"] == "nosniff"
            assert headers["referrer-policy"] == "no-referrer"
        assert (await client.get("/approvals")).status_code == 303
        assert (await client.get("/static/nope.js")).status_code == 404
        assert (
            (await client.get("/static/console.js"))
            .headers["content-type"]
            .startswith("text/javascript")
        )
        page = (await client.get("/signin")).text
        assert "<script src=" in page and "style=" not in page and "<script>" not in page


async def test_sign_in_sets_a_strict_cookie_and_sign_out_ends_the_session(tmp_path):
    """The session cookie is HttpOnly, SameSite=Strict, path-scoped; sign-out ends it."""
    async with rig(tmp_path) as r, httpx.AsyncClient(base_url=r.url) as client:
        response = await sign_in(client, r.token("human:alice"))
        assert response.status_code == 303 and response.headers["location"].endswith("/approvals")
        cookie = next(c for c in response.headers.get_list("set-cookie") if c.startswith(COOKIE))
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
        assert "Secure" not in cookie  # plain http here; https makes it Secure
        page = await client.get("/approvals")
        assert page.status_code == 200 and "human:alice" in page.text
        refused = await client.post("/signout", data={"csrf": "wrong"})
        assert refused.status_code == 403
        out = await client.post("/signout", data={"csrf": csrf_of(page.text)})
        assert out.status_code == 303
        assert (await client.get("/approvals")).status_code == 303
        [signed_in] = r.rows(event="console_sign_in")
        assert (signed_in["actor"], signed_in["status"]) == ("human:alice", "approver")
        assert r.rows(event="console_sign_out", status="signed_out")


async def test_sign_in_needs_the_forms_csrf_and_an_approver_or_auditor_token(tmp_path):
    """No CSRF, an unknown token, or a peer that is neither approver nor auditor: refused."""
    async with rig(tmp_path) as r, httpx.AsyncClient(base_url=r.url) as client:
        token = r.token("human:alice")
        no_csrf = await client.post("/signin", data={"token": token})
        assert no_csrf.status_code == 401 and COOKIE not in no_csrf.cookies
        unknown = await sign_in(client, "bcpbus_nope")
        assert unknown.status_code == 401 and "Sign-in refused" in unknown.text
        assert r.rows(event="auth_failed")
        agent = await sign_in(client, r.token("agent:main"))
        assert agent.status_code == 401
        assert r.rows(event="console_sign_in", status="refused", actor="agent:main")
        auditor = await sign_in(client, r.token("auditor:carol"))
        assert auditor.status_code == 303
        assert r.rows(event="console_sign_in", status="auditor", actor="auditor:carol")


async def test_a_decision_needs_the_sessions_csrf_and_a_form(tmp_path):
    """A decision without the session's CSRF token, or not a form, is refused before the bus."""
    async with rig(tmp_path) as r, httpx.AsyncClient(base_url=r.url) as client:
        await sign_in(client, r.token("human:alice"))
        forged = await client.post("/approvals/ap-1", data={"decision": "approve", "csrf": "x"})
        assert forged.status_code == 403
        as_json = await client.post("/approvals/ap-1", json={"decision": "approve"})
        assert as_json.status_code == 403
        assert not r.rows(event="send_start", actor="human:alice")


async def test_the_live_stream_needs_a_session_and_is_capped_per_session(tmp_path, monkeypatch):
    """Without a session the stream answers 401; with one it sends the lists, and one stream
    more than a session may hold is 429."""
    monkeypatch.setattr(live, "MAX_STREAMS_PER_SESSION", 1)
    async with rig(tmp_path) as r, httpx.AsyncClient(base_url=r.url) as client:
        assert (await client.get("/events")).status_code == 401
        await sign_in(client, r.token("human:alice"))
        async with client.stream("GET", "/events") as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.aiter_lines()
            assert await anext(lines) == "event: approvals"
            assert "Waiting for a decision" in await anext(lines) + await anext(lines)
            assert (await client.get("/events")).status_code == 429


CAT1 = {"category": 1, "fields": [{"name": "ok", "type": "boolean"}]}


async def test_an_escalation_shows_its_justification_and_is_decided_through_the_form(tmp_path):
    """An escalation's card shows the controller's reason as text, offers no edit, and a posted
    approval is the approver's own decision in the log."""
    async with rig(tmp_path) as r, httpx.AsyncClient(base_url=r.url) as client:

        async def handler(query: dict) -> dict:
            return {"ok": True} if query.get("category") == 1 else {"summary": "Fine."}

        r.reader.on_query(handler)
        await r.main.ask("researcher", CAT1, task_id="t", timeout=scaled(10))
        why = "<b>Need</b> the \u202egist"
        task = asyncio.create_task(
            r.main.ask("researcher", CAT3, task_id="t", escalation_justification=why, timeout=60)
        )
        await sign_in(client, r.token("human:alice"))
        async with asyncio.timeout(scaled(10)):
            while (
                "Why the controller escalates" not in (page := await client.get("/approvals")).text
            ):
                await r.console.feed.wait_changed(r.console.feed.version, 1.0)
        assert '&lt;b&gt;Need&lt;/b&gt; the <span class="cp">⟨U+202E⟩</span>gist' in page.text
        assert "Send the edit" not in page.text
        approval_id = re.search(r'id="card-(ap-[0-9a-f]+)"', page.text)[1]
        decided = await client.post(
            f"/approvals/{approval_id}", data={"csrf": csrf_of(page.text), "decision": "approve"}
        )
        assert decided.status_code == 303
        assert "the gateway took the decision" in (await client.get("/approvals")).text
        [row] = r.rows(event="bcp_approval_decided")
        assert (row["actor"], row["status"]) == ("human:alice", "approved")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_over_https_the_cookies_are_secure(tmp_path):
    """Served over TLS (the request's scheme is https), every cookie the console sets is Secure."""
    async with rig(tmp_path) as r:
        app = Starlette(routes=[Mount(PATH, app=r.console)])
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(
            transport=transport, base_url=f"https://console.test{PATH}"
        ) as client:
            page = await client.get("/signin")
            assert "Secure" in page.headers["set-cookie"]
            response = await sign_in(client, r.token("human:alice"))
            assert response.status_code == 303
            cookie = next(
                c for c in response.headers.get_list("set-cookie") if c.startswith(COOKIE)
            )
            assert "Secure" in cookie and "HttpOnly" in cookie


async def test_the_audit_page_shows_each_channels_risk_report(tmp_path):
    """The audit page carries the risk verdict of every channel of the agent definitions."""
    async with rig(tmp_path) as r, httpx.AsyncClient(base_url=r.url) as client:
        await sign_in(client, r.token("auditor:carol"))
        page = await client.get("/audit")
        assert page.status_code == 200
        risk = page.text.split('id="risk"', 1)[1].split("</section>", 1)[0]
        [channel] = check(r.console.agents_dir, query_ttl=300.0).channels
        assert "bcp:main:researcher" in risk and str(escape(channel.verdict)) in risk
        assert "ad_hoc cat-3" in risk
