"""The console: approvals and the audit trail in a browser, at ``/console`` on the HTTP port.

``bcpbus serve --http-port PORT`` serves it beside the HTTP binding's own routes, in the bus's
process: :func:`run_console` mounts :class:`Console` there for as long as the bus runs. People
sign in with the token of an approver (``human:NAME``: they decide) or an auditor
(``auditor:NAME``: they read); see docs/console.md.

- :mod:`.app`: the routes, sessions checked on each request;
- :mod:`.live`: the approvals page's live stream (server-sent events);
- :mod:`.decide`: a decision sent as the approver, as ``bcpbus approve`` sends it;
- :mod:`.feed`: the approvals, followed in the activity log;
- :mod:`.audit_page` and :mod:`.charts`: the audit page and its charts;
- :mod:`.cards`, :mod:`.text`, :mod:`.web`: what the pages show and how, safely.

Its dependencies (Starlette, Jinja2) come with the ``http`` extra.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from bus.ops.reload import Reloader
from bus.server import Bus

from .app import COOKIE, Console, Viewer
from .sessions import SessionSettings

__all__ = ["COOKIE", "PATH", "Console", "SessionSettings", "Viewer", "run_console"]

PATH = "/console"
"""Where the console is mounted on the HTTP binding's port."""


@contextlib.asynccontextmanager
async def run_console(
    bus: Bus,
    reloader: Reloader | None = None,
    *,
    agents_dir: Path | None = None,
    query_ttl: float = 300.0,
) -> AsyncIterator[Console | None]:
    """Serve the console on the bus's HTTP binding for the duration of the ``async with``
    block; without a binding (no ``--http-port``) there is nothing to serve it on: None.

    ``reloader`` is not needed: each request checks the bus's credentials and policy as they
    are after the latest reload. ``agents_dir`` and ``query_ttl`` give the audit page each
    channel's risk report.
    """
    if bus.http_mount is None:
        yield None
        return
    async with Console(bus, base=PATH, agents_dir=agents_dir, query_ttl=query_ttl) as console:
        bus.http_mount(PATH, console)
        if reloader is not None and bus.http_url is not None:
            reloader.say(f"bcpbus: console: {bus.http_url}{PATH}/")
        yield console
