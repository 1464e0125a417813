"""The console's routes: sign-in and sign-out, the approvals page and its live stream, decisions.

:class:`Console` is the ASGI app mounted at ``/console`` on the HTTP binding's port. Each page
asks :meth:`Console.viewer` who is asking: the session from the cookie, its token checked
against the bus's credentials again (a rotated or removed token ends the session there), and
what the policy lets that peer do now: decide (it may send ``bcp_approval_decision`` on
``system:approval``: an approver) or read only (it holds the ``auditor`` role). The audit page
is :mod:`peers.console.audit_page`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bus.core.errors import AuthenticationFailed, BusError, Forbidden
from bus.core.logevents import LogEvent
from bus.core.protocol import Request as RpcRequest
from bus.server import Bus
from schemas.common import APPROVAL_TOPIC

from ..approver import Decision, edited_response
from .audit_page import AuditPage
from .cards import card
from .decide import send_decision
from .feed import ApprovalFeed
from .live import LiveStream
from .sessions import Session, Sessions, SessionSettings, same_secret
from .web import FormError, SecurityHeaders, client_address, read_form, templates

__all__ = ["COOKIE", "Console", "Viewer"]

logger = logging.getLogger("peers.console")

COOKIE = "bcpbus_console"
"""The session cookie: the session's id, nothing else."""
_SIGNIN_COOKIE = "bcpbus_console_signin"  # the sign-in form's CSRF value, before any session
_STATIC = {"console.css": "text/css", "console.js": "text/javascript"}


@dataclass(frozen=True)
class Viewer:
    """Who asks, and what they may do now."""

    session: Session
    may_decide: bool

    @property
    def role(self) -> str:
        return "approver" if self.may_decide else "auditor"


class Console:
    """The console of one bus, served under ``base`` (``/console``).

    Args:
        bus: the started bus; its credentials, policy and log are the console's.
        base: the path it is mounted at.
        sessions: timeouts and the cap of sessions.
        interval: seconds between two reads of the log's new approval rows.
        agents_dir: the agent definitions, for the audit page's risk report of each channel
            (``bcpbus agents check``); None shows none.
        query_ttl: the gateway's ``query_ttl``, which the report's timing bits use.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        base: str = "/console",
        sessions: SessionSettings | None = None,
        interval: float = 0.5,
        agents_dir: Path | None = None,
        query_ttl: float = 300.0,
    ) -> None:
        self.bus = bus
        self.agents_dir = agents_dir
        self.query_ttl = query_ttl
        self.base = base
        self.sessions = Sessions(sessions)
        self.feed = ApprovalFeed(bus.log.path, interval=interval)
        self.env = templates()
        self.audit = AuditPage(self)
        self.live = LiveStream(self)
        self.closing = asyncio.Event()
        """Set by :meth:`close`: live streams end."""
        routes = [
            Route("/", self._home, methods=["GET"]),
            Route("/signin", self._signin_page, methods=["GET"]),
            Route("/signin", self._signin, methods=["POST"]),
            Route("/signout", self._signout, methods=["POST"]),
            Route("/approvals", self._approvals, methods=["GET"]),
            Route("/approvals/{approval_id}", self._decide, methods=["POST"]),
            Route("/events", self.live.endpoint, methods=["GET"]),
            Route("/audit", self.audit.page, methods=["GET"]),
            Route("/audit/verify", self.audit.verify, methods=["POST"]),
            Route("/static/{name}", self._static, methods=["GET"]),
        ]
        self.app = SecurityHeaders(Starlette(routes=routes))
        """The ASGI app; mount it at ``base``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    async def start(self) -> None:
        """Read the log's approvals and start following it."""
        await self.feed.start()

    async def close(self) -> None:
        """End every live stream and stop following the log. Idempotent."""
        self.closing.set()
        await self.feed.close()

    async def __aenter__(self) -> Console:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # Who asks

    async def viewer(self, request: Request, *, touch: bool = True) -> Viewer | None:
        """The signed-in person behind ``request``, or None (then send them to sign in).

        A session whose token the bus no longer knows (rotated, removed), or whose peer the
        policy no longer lets read, is ended here, with a ``console_sign_out`` row.
        """
        session = self.sessions.get(request.cookies.get(COOKIE), touch=touch)
        if session is None:
            return None
        if not session.still_valid(self.bus.credentials):
            await self._end(session, "token_revoked")
            return None
        access = await self._access(session.token, client_address(request))
        if access is None:
            await self._end(session, "role_revoked")
            return None
        return Viewer(session, access == "approver")

    async def _access(self, token: str, address: str) -> str | None:
        """``approver``, ``auditor``, or None: what the token's peer may do in the console."""
        rpc = RpcRequest(f"console-{secrets.token_hex(8)}", "console", None)
        try:
            route = await self.bus.route_for_token(token, rpc, address=address)
        except BusError:
            return None
        if route.grants.may_send("bcp_approval_decision", APPROVAL_TOPIC):
            return "approver"
        return "auditor" if "auditor" in route.grants.roles else None

    async def _end(self, session: Session, why: str) -> None:
        self.sessions.end(session.id)
        with contextlib.suppress(BusError):  # ended either way; the log says why it could not
            await self._log(LogEvent.CONSOLE_SIGN_OUT, session.client_id, why)

    async def _log(
        self, event: LogEvent, actor: str, status: str, address: str | None = None
    ) -> None:
        """Record a sign-in or sign-out row and wait for it to be written.

        Raises:
            AuditUnavailable: the log cannot take it; a sign-in is then refused.
        """
        self.bus.log.record(event, actor=actor, status=status, payload=address)
        await self.bus.log.commit()

    # Pages

    def render(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A page from the template ``name``."""
        html = self.env.get_template(name).render(base=self.base, **context)
        return HTMLResponse(html, status_code=status)

    def to_signin(self, why: str | None = None) -> Response:
        """Send the browser to the sign-in page."""
        where = f"{self.base}/signin" + (f"?why={why}" if why else "")
        return RedirectResponse(where, status_code=303)

    async def _home(self, request: Request) -> Response:
        return RedirectResponse(f"{self.base}/approvals", status_code=303)

    async def _signin_page(self, request: Request, error: str | None = None) -> Response:
        why = request.query_params.get("why")
        notes = {
            "ended": "Your session ended: the token was rotated or removed, or you were away "
            "too long. Sign in again.",
            "out": "You are signed out.",
        }
        csrf = secrets.token_urlsafe(32)
        response = self.render(
            "signin.html", 401 if error else 200, csrf=csrf, error=error, note=notes.get(why or "")
        )
        self._cookie(response, request, _SIGNIN_COOKIE, csrf, max_age=3600)
        return response

    async def _signin(self, request: Request) -> Response:
        try:
            form = await read_form(request)
        except FormError as exc:
            return Response(str(exc), status_code=exc.status, media_type="text/plain")
        if not same_secret(form.get("csrf"), request.cookies.get(_SIGNIN_COOKIE, "")) or not (
            form.get("csrf")
        ):
            return await self._signin_page(request, "The form expired: please try again.")
        token = form.get("token", "").strip()
        address = client_address(request)
        access = await self._access(token, address)
        record = self.bus.credentials.identify(token)
        if access is None or record is None:
            if record is not None:
                with contextlib.suppress(BusError):  # refused either way
                    await self._log(LogEvent.CONSOLE_SIGN_IN, record.client_id, "refused", address)
            return await self._signin_page(
                request,
                "Sign-in refused: give the token of an approver (human:NAME) or an auditor.",
            )
        try:
            await self._log(LogEvent.CONSOLE_SIGN_IN, record.client_id, access, address)
        except BusError:
            return Response("the activity log is unavailable\n", 503, media_type="text/plain")
        session = self.sessions.start(record.client_id, token)
        response = RedirectResponse(f"{self.base}/approvals", status_code=303)
        self._cookie(response, request, COOKIE, session.id)
        response.delete_cookie(_SIGNIN_COOKIE, path=self.base)
        return response

    async def _signout(self, request: Request) -> Response:
        viewer = await self.viewer(request)
        if viewer is not None:
            form = await self._checked_form(request, viewer)
            if form is None:
                return self.render("error.html", 403, message="The form expired: reload the page.")
            await self._end(viewer.session, "signed_out")
        response = self.to_signin("out")
        response.delete_cookie(COOKIE, path=self.base)
        return response

    async def _approvals(self, request: Request) -> Response:
        viewer = await self.viewer(request)
        if viewer is None:
            return self.to_signin("ended" if COOKIE in request.cookies else None)
        await self.feed.refresh()
        flash, viewer.session.flash = viewer.session.flash, []
        return self.render("approvals.html", viewer=viewer, flash=flash, **self.lists())

    def lists(self) -> dict[str, Any]:
        """The approval cards: ``pending`` oldest first, ``decided`` newest first."""
        now = datetime.now(UTC)
        cards = [card(approval, now) for approval in self.feed.approvals]
        pending = [c for c in cards if c.status == "pending"]
        decided = [c for c in reversed(cards) if c.status != "pending"]
        return {"pending": pending, "decided": decided}

    # Deciding

    async def _decide(self, request: Request) -> Response:
        viewer = await self.viewer(request)
        if viewer is None:
            return self.to_signin("ended")
        form = await self._checked_form(request, viewer)
        if form is None:
            return self.render("error.html", 403, message="The form expired: reload the page.")
        approval_id = request.path_params["approval_id"]
        outcome = await self._send(request, viewer, approval_id, form)
        if isinstance(outcome, Response):
            return outcome
        await self.feed.refresh()
        viewer.session.flash.append(outcome)
        return RedirectResponse(f"{self.base}/approvals", status_code=303)

    async def _send(
        self, request: Request, viewer: Viewer, approval_id: str, form: dict[str, str]
    ) -> tuple[str, str] | Response:
        decision = form.get("decision", "")
        if decision not in ("approve", "reject", "edit"):
            return ("error", "Choose approve, reject or edit.")
        chosen: Decision = decision  # type: ignore[assignment]
        edited = None
        if chosen == "edit":
            known = self.feed.get(approval_id)
            category = (known.request.get("spec") or {}).get("category") if known else None
            try:
                edited = edited_response(form.get("edited", ""), int(category or 0))
            except ValueError as exc:
                return ("error", f"The edit was not sent: {exc}.")
        try:
            outcome = await send_decision(
                self.bus,
                viewer.session.token,
                approval_id,
                chosen,
                edited=edited,
                reason=form.get("reason", "").strip() or None,
                address=client_address(request),
            )
        except AuthenticationFailed:
            return self.to_signin("ended")
        except Forbidden:
            message = f"{viewer.session.client_id} may not decide approvals: it reads only."
            return self.render("error.html", 403, message=message)
        except BusError as exc:
            return ("error", f"The bus refused the decision: {exc}")
        return ("ok" if outcome.taken else "error", outcome.text)

    async def _checked_form(self, request: Request, viewer: Viewer) -> dict[str, str] | None:
        """The form, if it carries this session's CSRF token; else None."""
        try:
            form = await read_form(request)
        except FormError:
            return None
        return form if same_secret(form.get("csrf"), viewer.session.csrf) else None

    # Static files and cookies

    async def _static(self, request: Request) -> Response:
        name = request.path_params["name"]
        kind = _STATIC.get(name)
        if kind is None:
            return Response("not found\n", status_code=404, media_type="text/plain")
        body = resources.files("peers.console").joinpath("static", name).read_bytes()
        return Response(body, media_type=kind, headers={"Cache-Control": "no-cache"})

    def _cookie(
        self,
        response: Response,
        request: Request,
        name: str,
        value: str,
        max_age: int | None = None,
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path=self.base,
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
