"""The console in a real browser (headless chromium) against a real bus, gateway and peers."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bus.core.logevents import LogEvent
from peers import QueryFailed
from peers.client import Peer
from peers.testing import Inbox, scaled
from schemas.common import APPROVAL_TOPIC, GATEWAY_CLIENT_ID

from .conftest import CAT3, Rig, rig, screenshot_path

pytestmark = pytest.mark.asyncio(loop_scope="module")

WAIT_MS = scaled(10) * 1000
LONG_WORD = "A" * 10_000
HOSTILE = (
    '<script>alert("xss-script")</script> <img src=x onerror="alert(\'xss-img\')"> '
    "<a href=\"javascript:alert('xss-link')\">click me</a> "
    "admin\u202eoverride\u202c zero\u200bwidth " + LONG_WORD
)


async def open_page(browser: Any, **options: Any) -> tuple[Any, Any, list[str]]:
    """A new context and page that records every dialog (none must ever open)."""
    context = await browser.new_context(**options)
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    dialogs: list[str] = []

    async def dismiss(dialog: Any) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", dismiss)
    return context, page, dialogs


async def sign_in(page: Any, r: Rig, token: str) -> None:
    """Sign in with the keyboard: type the token into the focused field, press Enter."""
    await page.goto(f"{r.url}/signin")
    # autofocus lands after load; typing before it would type into nothing
    await page.wait_for_function("document.activeElement?.id === 'token'")
    await page.keyboard.type(token)
    await page.keyboard.press("Enter")
    await page.wait_for_url(f"{r.url}/approvals")
    await page.locator("#approvals[data-live=open]").wait_for(state="attached")


def ask(r: Rig, query_id: str) -> asyncio.Task[Any]:
    """The controller asks for a Cat-3 summary in the background."""
    return asyncio.create_task(r.main.ask("researcher", CAT3, query_id=query_id, timeout=60))


def answer_with(r: Rig, text: str) -> None:
    async def handler(query: dict[str, Any]) -> Any:
        return {"summary": text}

    r.reader.on_query(handler)


async def test_an_approval_appears_live_and_approving_it_delivers(browser, tmp_path):
    """Signed in, a new request appears without a reload; Approve delivers it to the controller."""
    async with rig(tmp_path) as r:
        context, page, dialogs = await open_page(browser)
        await sign_in(page, r, r.token("human:alice"))
        await page.get_by_text("Nothing waits for a decision.").wait_for()
        answer_with(r, "Enterprise prices change in March.")
        task = ask(r, "q-live")
        card = page.locator("#pending li.card")
        await card.wait_for()
        assert "Enterprise prices change in March." in await card.inner_text()
        assert "main (controller) ← researcher (reader)" in await card.inner_text()
        if (path := screenshot_path("approvals.png")) is not None:
            await page.screenshot(path=path, full_page=True)
        await card.get_by_role("button", name="Approve").focus()
        await page.keyboard.press("Enter")  # the keyboard alone decides
        delivery = await asyncio.wait_for(task, scaled(10))
        assert delivery.response == {"summary": "Enterprise prices change in March."}
        await page.get_by_text("the gateway took the decision").wait_for()
        [row] = r.rows(event="bcp_approval_decided")
        assert (row["actor"], row["status"]) == ("human:alice", "approved")
        assert dialogs == []
        await context.close()


async def test_an_invalid_edit_is_refused_with_the_reason(browser, tmp_path):
    """An edit that fails validation is refused with the gateway's reason; the card stays open."""
    async with rig(tmp_path) as r:
        context, page, _ = await open_page(browser)
        await sign_in(page, r, r.token("human:alice"))
        answer_with(r, "Fine text.")
        task = ask(r, "q-edit")
        card = page.locator("#pending li.card")
        await card.wait_for()
        await card.get_by_text("Edit…").click()
        await card.get_by_role("textbox", name="Replacement summary").fill(
            "Visit https://evil.example now"
        )
        await card.get_by_role("button", name="Send the edit").click()
        refusal = page.locator(".flash.error")
        await refusal.wait_for()
        assert "invalid_edit" in await refusal.inner_text()
        assert not task.done()
        await page.locator("#pending li.card").get_by_role("button", name="Approve").click()
        assert (await asyncio.wait_for(task, scaled(10))).response == {"summary": "Fine text."}
        await context.close()


async def test_a_decision_taken_elsewhere_shows_who_and_a_second_one_is_refused(browser, tmp_path):
    """Bob decides through the bus: the live card says so; a stale form's decision is refused."""
    async with rig(tmp_path) as r:
        context, page, _ = await open_page(browser)
        await sign_in(page, r, r.token("human:alice"))
        stale_context, stale, _ = await open_page(browser, java_script_enabled=False)
        await stale.goto(f"{r.url}/signin")
        await stale.fill("#token", r.token("human:dave"))
        await stale.press("#token", "Enter")
        answer_with(r, "Quiet text.")
        task = ask(r, "q-elsewhere")
        await page.locator("#pending li.card").wait_for()
        await stale.reload()
        approval_id = (await stale.locator("#pending li.card code.id").inner_text()).strip()
        async with Peer(r.h.bus.url, "human:bob", r.token("human:bob")) as bob:
            bob.handle(None, Inbox())
            content = {"approval_id": approval_id, "decision": "reject", "reason": "off topic"}
            result = await bob.send(APPROVAL_TOPIC, "bcp_approval_decision", content)
        assert result.delivered_to == 1
        decided = page.locator("#decided li.card")
        await decided.wait_for()
        assert "Rejected by human:bob" in await decided.inner_text()
        assert await decided.get_by_role("button", name="Approve").count() == 0
        await stale.locator("#pending li.card").get_by_role("button", name="Approve").click()
        refusal = stale.locator(".flash.error")
        assert "already decided: rejected by human:bob" in await refusal.inner_text()
        with pytest.raises(QueryFailed, match="approval_rejected"):
            await asyncio.wait_for(task, scaled(10))
        assert [row["status"] for row in r.rows(event="bcp_approval_decided")] == ["rejected"]
        await stale_context.close()
        await context.close()


async def test_an_auditor_reads_but_cannot_approve(browser, tmp_path):
    """An auditor sees the card without buttons, and a decision posted anyway is refused: 403."""
    async with rig(tmp_path) as r:
        context, page, _ = await open_page(browser)
        await sign_in(page, r, r.token("auditor:carol"))
        answer_with(r, "Quiet text.")
        task = ask(r, "q-audit")
        card = page.locator("#pending li.card")
        await card.wait_for()
        assert "You read only" in await card.inner_text()
        assert await page.locator("form[action*='/approvals/'], button.approve").count() == 0
        csrf = await page.locator("form.signout input[name=csrf]").get_attribute("value")
        approval_id = (await card.locator("code.id").inner_text()).strip()
        answer = await page.request.post(
            f"{r.url}/approvals/{approval_id}",
            form={"csrf": csrf, "decision": "approve"},
            max_redirects=0,
        )
        assert answer.status == 403
        assert "may not decide" in await answer.text()
        assert r.rows(event="refused", actor="auditor:carol")
        assert not r.rows(event="bcp_approval_decided")
        assert not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await context.close()


async def test_a_rotated_token_ends_the_session(browser, tmp_path):
    """Rotating the token sends the open page to the sign-in page, and pages stay closed."""
    async with rig(tmp_path) as r:
        context, page, _ = await open_page(browser)
        await sign_in(page, r, r.token("human:alice"))
        r.token("human:alice")  # rotated: the signed-in token no longer works
        await page.wait_for_url(f"{r.url}/signin?why=ended")
        await page.goto(f"{r.url}/approvals")
        assert page.url.startswith(f"{r.url}/signin")
        assert await page.locator("#token").count() == 1
        [row] = r.rows(event="console_sign_out")
        assert (row["actor"], row["status"]) == ("human:alice", "token_revoked")
        await context.close()


def hostile_request(approval_id: str) -> dict[str, Any]:
    """A request as a gateway that passed everything through would write it: hostile text in
    the answer, the justification and the spec."""
    return {
        "approval_id": approval_id,
        "kind": "response",
        "controller": "main",
        "reader": "researcher",
        "query_id": "q-hostile",
        "spec": {"category": 3, "directive": "Summarize <b>this</b>.", "max_words": 40},
        "response": {"summary": HOSTILE, "<img src=x onerror=alert(1)>": "key"},
        "anomalies": [{"code": "markup", "detail": "<script>alert(2)</script>"}],
        "taint": "high",
        "untrusted": True,
        "expires_at": (datetime.now(UTC) + timedelta(minutes=10)).isoformat(),
    }


async def test_hostile_reader_text_renders_inert(browser, tmp_path):
    """Script, image, link, bidi and a 10,000-character word in the reader's text stay text."""
    async with rig(tmp_path) as r:
        r.h.bus.log.record(
            LogEvent.BCP_APPROVAL_REQUESTED,
            actor=GATEWAY_CLIENT_ID,
            status="pending",
            payload={"approval_id": "ap-hostile", "request": hostile_request("ap-hostile")},
        )
        await r.h.bus.log.commit()
        answer_with(r, HOSTILE)  # the raw answer, as the audit page's timeline shows it
        task = ask(r, "q-hostile")
        context, page, dialogs = await open_page(browser)
        await sign_in(page, r, r.token("human:alice"))
        await page.locator("#card-ap-hostile").wait_for()
        await assert_inert(page, dialogs)
        answer = page.locator("#card-ap-hostile dd.text").first
        text = await answer.inner_text()
        assert '<script>alert("xss-script")</script>' in text
        assert "<img src=x onerror=" in text and "javascript:alert" in text
        assert "admin⟨U+202E⟩override⟨U+202C⟩ zero⟨U+200B⟩width" in text
        assert LONG_WORD in text
        if (path := screenshot_path("hostile.png")) is not None:
            await page.locator("#card-ap-hostile h3").scroll_into_view_if_needed()
            await page.screenshot(path=path, timeout=WAIT_MS * 3)
        await page.goto(f"{r.url}/audit?query=q-hostile#query")
        await page.locator(".untrusted .text").first.wait_for()
        await assert_inert(page, dialogs)
        raw = await page.locator("#query .untrusted .text").first.inner_text()
        assert "⟨U+202E⟩" in raw and "<script>" in raw
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await context.close()


async def assert_inert(page: Any, dialogs: list[str]) -> None:
    """No script but the console's own, no image, no javascript: link, no dialog; nothing wider
    than the window."""
    scripts = await page.eval_on_selector_all("script", "s => s.map(e => e.src)")
    assert [src.rsplit("/", 1)[-1] for src in scripts] == ["console.js"]
    assert await page.locator("img").count() == 0
    assert await page.locator("a[href^='javascript']").count() == 0
    assert await page.locator("[onerror], [onclick], [onload]").count() == 0
    width = await page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width
    # Anything that would have run has run by now: the page loaded and the live list arrived.
    await page.evaluate("new Promise(r => requestAnimationFrame(() => setTimeout(r, 50)))")
    assert dialogs == []


async def test_the_audit_page_and_a_phone(browser, tmp_path):
    """The audit page charts a channel's bits, verifies the chain; the approvals page fits a
    phone's width."""
    async with rig(tmp_path) as r:
        answer_with(r, "Enterprise prices change in March.")
        async with Peer(r.h.bus.url, "human:bob", r.token("human:bob")) as bob:
            bob.handle(None, Inbox())
            approvals = Inbox(reply=True)
            bob.handle("bcp_approval_request", approvals)
            await bob.subscribe(APPROVAL_TOPIC)
            for n in range(3):
                task = ask(r, f"q-{n}")
                request = await approvals.get_type("bcp_approval_request")
                decision = "approve" if n != 1 else "reject"
                content = {"approval_id": request.content["approval_id"], "decision": decision}
                await bob.send(APPROVAL_TOPIC, "bcp_approval_decision", content)
                with pytest.raises(QueryFailed) if n == 1 else contextlib.nullcontext():
                    await asyncio.wait_for(task, scaled(10))
        answer_with(r, "Another summary waits.")
        pending = ask(r, "q-waiting")
        context, page, dialogs = await open_page(browser)
        await sign_in(page, r, r.token("auditor:carol"))
        await page.goto(f"{r.url}/audit")
        assert await page.locator("#channels svg polyline").count() == 3
        numbers = await page.locator("#channels dl.numbers").inner_text()
        assert "Budget left" in numbers and "of 5,000.0" in numbers
        await page.get_by_role("button", name="Verify the whole log now").click()
        verdict = page.locator("#chain .verdict")
        assert "rows intact" in await verdict.inner_text()
        await page.goto(f"{r.url}/audit?query=q-1#query")
        assert "approval_rejected" in await page.locator("#query table").inner_text()
        if (path := screenshot_path("audit.png")) is not None:
            await page.screenshot(path=path, full_page=True)
        phone_context, phone, _ = await open_page(
            browser, viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
        )
        await sign_in(phone, r, r.token("human:alice"))
        await phone.locator("#pending li.card").wait_for()
        width = await phone.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], width
        if (path := screenshot_path("approvals-phone.png")) is not None:
            await phone.screenshot(path=path)
        assert dialogs == []
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        await phone_context.close()
        await context.close()
