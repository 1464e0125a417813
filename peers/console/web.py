"""What every console response shares: security headers, forms, cookies, templates.

The headers go on every response, pages, redirects, the live stream and static files alike
(:class:`SecurityHeaders`): a Content-Security-Policy that lets the page load scripts, styles
and images from the bus only, with no inline script or style and no other origin; no framing;
no referrer; no caching of pages that hold approvals.

Forms are read here (:func:`read_form`), ``application/x-www-form-urlencoded`` only and at most
:data:`MAX_FORM_BYTES`, without a multipart parser: the console's forms hold a few fields.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .text import reveal

__all__ = [
    "CSP",
    "MAX_FORM_BYTES",
    "FormError",
    "SecurityHeaders",
    "client_address",
    "read_form",
    "templates",
]

CSP = (
    "default-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)
"""No inline script or style, no other origin: every asset is the bus's own."""

MAX_FORM_BYTES = 64 * 1024

_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class FormError(ValueError):
    """A form that is not one: wrong content type or too large. Answer 400 or 413."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class SecurityHeaders:
    """ASGI middleware: the console's headers on every response, ``Cache-Control: no-store``
    unless the response sets its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                headers += [(name, value) for name, value in _HEADERS if name not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def read_form(request: Request) -> dict[str, str]:
    """The fields of a URL-encoded form, the last value of each.

    Raises:
        FormError: the body is not URL-encoded (400) or larger than :data:`MAX_FORM_BYTES` (413).
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise FormError("expected a form (application/x-www-form-urlencoded)", 400)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise FormError(f"the form is larger than {MAX_FORM_BYTES} bytes", 413)
        chunks.append(chunk)
    text = b"".join(chunks).decode("utf-8", "replace")
    fields = parse_qs(text, keep_blank_values=True, max_num_fields=32)
    return {name: values[-1] for name, values in fields.items()}


def client_address(request: Request) -> str:
    """The browser's address, for log rows."""
    return request.client.host if request.client is not None else "unknown"


def templates() -> Environment:
    """The console's Jinja2 environment: autoescape always on, undefined names an error, and
    the filters the templates use (``reveal`` for anything a peer wrote)."""
    env = Environment(
        loader=PackageLoader("peers.console", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["reveal"] = reveal
    env.filters["bits"] = _bits
    env.filters["until"] = _until
    return env


def _bits(value: Any) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:,.1f}"


def _until(value: Any) -> str:
    """``in 9m 58s`` or ``3m 2s ago`` for an ISO time; empty if it is not one."""
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return ""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = int((moment - datetime.now(UTC)).total_seconds())
    minutes, rest = divmod(abs(seconds), 60)
    span = f"{minutes}m {rest}s" if minutes else f"{rest}s"
    return f"in {span}" if seconds > 0 else f"{span} ago"
