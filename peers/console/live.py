"""The approvals page's live stream: server-sent events from ``GET /console/events``.

While a page is open, :class:`LiveStream` sends it the approval lists, rendered by the same
template as the page, whenever the feed changes (:mod:`peers.console.feed`), and at least every
15 seconds (keeping proxies from closing the connection and the expiry times current). Once a
second it checks that the session still holds, as every page does: when the token is rotated
or removed, it sends ``signout`` and ends, and the page's script goes to the sign-in page.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

if TYPE_CHECKING:
    from .app import Console, Viewer

__all__ = ["MAX_STREAMS_PER_SESSION", "LiveStream"]

_KEEPALIVE = 15.0
MAX_STREAMS_PER_SESSION = 8
"""Live streams one session may hold open (tabs); each holds an HTTP connection of the
binding's ``max_connections``."""


class LiveStream:
    """The live streams of one console."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.streams: collections.Counter[str] = collections.Counter()
        """Open streams by session id."""

    async def endpoint(self, request: Request) -> Response:
        """``GET /console/events``: 401 without a session, 429 past the streams a session may
        hold, else the stream."""
        viewer = await self.console.viewer(request, touch=False)
        if viewer is None:
            return Response("sign in first\n", status_code=401, media_type="text/plain")
        if self.streams[viewer.session.id] >= MAX_STREAMS_PER_SESSION:
            text = f"at most {MAX_STREAMS_PER_SESSION} live pages per session\n"
            return Response(text, status_code=429, media_type="text/plain")
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        stream = self._stream(request, viewer)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)

    async def _stream(self, request: Request, viewer: Viewer) -> AsyncIterator[str]:
        """Server-sent events: ``approvals`` with the lists' HTML whenever they change, and
        ``signout`` when the session ends (the script then goes to the sign-in page)."""
        self.streams[viewer.session.id] += 1
        try:
            with self.console.feed.watching():
                async for event in self._events(request, viewer):
                    yield event
        finally:
            self.streams[viewer.session.id] -= 1
            if not self.streams[viewer.session.id]:
                del self.streams[viewer.session.id]

    async def _events(self, request: Request, viewer: Viewer) -> AsyncIterator[str]:
        console = self.console
        shown, quiet = -1, 0.0
        template = console.env.get_template("_lists.html")
        while not console.closing.is_set():
            if await console.viewer(request, touch=False) is None:
                yield f"event: signout\ndata: {console.base}/signin?why=ended\n\n"
                return
            if shown != console.feed.version or quiet >= _KEEPALIVE:
                shown, quiet = console.feed.version, 0.0
                html = template.render(base=console.base, viewer=viewer, **console.lists())
                yield "event: approvals\n" + "".join(f"data: {line}\n" for line in html.split("\n"))
                yield "\n"
            # Wake on a change, and at least once a second to see the session still holds.
            version = await console.feed.wait_changed(shown, 1.0)
            quiet += 1.0 if version == shown else 0.0
