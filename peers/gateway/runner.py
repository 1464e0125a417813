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
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path

from bus.log.activity import ActivityLog
from bus.ops.config import AuditSettings, LogContent
from bus.ops.reload import Reloader
from bus.server import Bus
from bus.transports.local import Socket
from peers.client import ConnectionEvent, GaveUp, Peer
from schemas.agents import build_channels, load_agents
from schemas.common import GATEWAY_CLIENT_ID

from .gateway import Gateway
from .reload import BudgetResets, GatewayChannels, last_row_id
from .restore import create_views, restore
from .settings import GatewaySettings

__all__ = ["run_beside", "run_standalone", "running_gateway", "watch"]


@contextlib.asynccontextmanager
async def running_gateway(
    url: str,
    token: str,
    log: ActivityLog,
    agents_dir: str | Path,
    settings: GatewaySettings | None = None,
    *,
    connector: Callable[[], Awaitable[Socket]] | None = None,
    cafile: Path | None = None,
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
    peer = Peer(url, GATEWAY_CLIENT_ID, token, connector=connector, cafile=cafile)
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
    bus: Bus,
    reloader: Reloader | None = None,
    *,
    agents_dir: Path,
    settings: GatewaySettings | None = None,
) -> AsyncIterator[Gateway]:
    """Run the gateway in the bus's process, sharing its activity log.

    It connects over an in-process link (:mod:`bus.transports.local`), not a socket, and
    authenticates
    like any peer. Its credential is made for this run only and never written to the peers
    file. With a ``reloader``, its channels are reloaded with the bus's files and budget
    resets take effect at once.
    """
    token = bus.credentials.add_ephemeral(GATEWAY_CLIENT_ID, [])
    after = await asyncio.to_thread(last_row_id, Path(bus.log.path))
    async with running_gateway(
        bus.url,
        token,
        bus.log,
        agents_dir,
        settings,
        connector=bus.connect_local,
        log_content=bus.log_content,
    ) as gateway:
        if reloader is not None:
            watch(gateway, reloader, agents_dir, Path(bus.log.path), after)
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


def watch(gateway: Gateway, reloader: Reloader, agents_dir: Path, db: Path, after: int) -> None:
    """Reload ``gateway``'s channels with ``reloader``'s other parts, and apply the budget
    resets written to ``db`` after row ``after``."""
    reloader.add(GatewayChannels(gateway, agents_dir))
    reloader.polls.append(BudgetResets(gateway, db, after, say=reloader.say))


async def run_standalone(
    url: str,
    token: str,
    db: Path,
    agents_dir: Path,
    settings: GatewaySettings,
    *,
    cafile: Path | None = None,
    log_content: LogContent | None = None,
    audit: AuditSettings | None = None,
) -> int:
    """Run the gateway as its own process until SIGINT or SIGTERM; return the exit code.

    Raises:
        AuthenticationFailed: the bus refused the gateway's token, at the start or on a
            reconnect (revoked or rotated while it ran).

    SIGHUP, or a change to the agent definitions, reloads its channels; budget resets take
    effect within a second. ``audit`` names the chain's key file (the bus's) for the rows it
    writes to ``db``.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    after = await asyncio.to_thread(last_row_id, db)
    key_file = audit.key_file if audit is not None else None
    async with (
        ActivityLog(db, key_file=key_file) as log,
        running_gateway(
            url, token, log, agents_dir, settings, cafile=cafile, log_content=log_content
        ) as g,
    ):
        g.peer.on_connection = partial(_stop_on_refusal, stop)
        reloader = Reloader(log, say=_stderr)
        watch(g, reloader, agents_dir, db, after)
        loop.add_signal_handler(signal.SIGHUP, reloader.trigger)
        async with reloader:
            print(f"gateway connected to {url}", flush=True)
            await stop.wait()
        if g.peer.gave_up is not None:
            raise g.peer.gave_up
    return 0


def _stop_on_refusal(stop: asyncio.Event, event: ConnectionEvent) -> None:
    """Stop once the SDK gave up reconnecting because the bus refused the token (revoked,
    rotated): a gateway left waiting would deliver nothing and say nothing."""
    if isinstance(event, GaveUp):
        stop.set()


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
