"""Start the gateway beside an in-process bus (``bcpbus serve``) or alone (``bcpbus gateway``).

Both load the agent definitions, build the channels, restore budgets and the outbox from the
activity log, start the gateway and fail whatever was in flight when it last stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from bus.activity import ActivityLog
from bus.config import AuditSettings, LogContent
from bus.local import Socket
from bus.server import Bus
from peers.client import Peer
from schemas.agents import build_channels, load_agents
from schemas.common import GATEWAY_CLIENT_ID

from .gateway import Gateway
from .restore import create_views, restore
from .settings import GatewaySettings

__all__ = ["run_beside", "run_standalone", "running_gateway"]


@contextlib.asynccontextmanager
async def running_gateway(
    url: str,
    token: str,
    log: ActivityLog,
    agents_dir: str | Path,
    settings: GatewaySettings | None = None,
    *,
    connector: Callable[[], Awaitable[Socket]] | None = None,
    log_content: LogContent | None = None,
) -> AsyncIterator[Gateway]:
    """Run a gateway connected to ``url`` (or through ``connector``, see
    :class:`peers.client.Peer`) for the duration of the ``async with`` block.

    ``log_content`` is what its rows keep of questions, answers and values (``full`` or
    ``digest``); None for the mode of the log's latest ``bus_start`` row (``full`` if none).

    Raises:
        DefinitionError: an agent definition is inconsistent (the message names file and field).
        AuthenticationFailed: the bus refused the gateway's token.
    """
    channels = build_channels(load_agents(agents_dir))
    peer = Peer(url, GATEWAY_CLIENT_ID, token, connector=connector)
    mode: LogContent = (
        log_content
        if log_content is not None
        else await asyncio.to_thread(logged_content_mode, log.path)
    )
    gateway = Gateway(peer, channels, log, settings=settings, log_content=mode)
    await asyncio.to_thread(create_views, log.path)
    orphans = restore(gateway, log.path)
    await gateway.start()
    try:
        await gateway.settle(orphans)
        yield gateway
    finally:
        await gateway.close()


@contextlib.asynccontextmanager
async def run_beside(
    bus: Bus, *, agents_dir: Path, settings: GatewaySettings | None = None
) -> AsyncIterator[Gateway]:
    """Run the gateway in the bus's process, sharing its activity log.

    It connects over an in-process link (:mod:`bus.local`), not a socket, and authenticates
    like any peer. Its credential is made for this run only and never written to the peers
    file.
    """
    token = bus.credentials.add_ephemeral(GATEWAY_CLIENT_ID, [])
    async with running_gateway(
        bus.url,
        token,
        bus.log,
        agents_dir,
        settings,
        connector=bus.connect_local,
        log_content=bus.log_content,
    ) as gateway:
        yield gateway


def logged_content_mode(db: str | Path) -> LogContent:
    """The ``log_content`` of the log's latest ``bus_start`` row; ``full`` if there is none."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        found = conn.execute(
            "SELECT payload_json FROM activity_log WHERE event = 'bus_start' ORDER BY id DESC "
            "LIMIT 1"
        ).fetchone()
    try:
        mode = json.loads(found[0]).get("log_content") if found else None
    except (TypeError, ValueError, AttributeError):
        mode = None
    return "digest" if mode == "digest" else "full"


async def run_standalone(
    url: str,
    token: str,
    db: Path,
    agents_dir: Path,
    settings: GatewaySettings,
    *,
    log_content: LogContent | None = None,
    audit: AuditSettings | None = None,
) -> int:
    """Run the gateway as its own process until SIGINT or SIGTERM; return the exit code.

    ``audit`` names the chain's key file (the bus's) for the rows it writes to ``db``.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    key_file = audit.key_file if audit is not None else None
    async with (
        ActivityLog(db, key_file=key_file) as log,
        running_gateway(url, token, log, agents_dir, settings, log_content=log_content),
    ):
        print(f"gateway connected to {url}", flush=True)
        await stop.wait()
    return 0
