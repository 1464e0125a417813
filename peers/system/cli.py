"""The ``bcpbus system`` command: the system peer, until SIGINT or SIGTERM.

::

    bcpbus system --token-file system.token --tokens-dir agent-tokens      # text lines
    bcpbus system --token-file system.token --tokens-dir agent-tokens --json

Each event is one line on stdout (``--json``: one JSON object per line): ``ready`` once it is
subscribed to ``system:spawn``, then ``started``, ``spawn_refused``, ``output`` (a line an agent
wrote), ``exited``. On SIGINT or SIGTERM it stops the agents it started, then exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from bus.core.identities import default_agents_dir
from schemas.chat import SYSTEM_CLIENT_ID

from ..approver import neutralize
from ..client import ConnectionEvent, GaveUp, Peer
from ..errors import PeerError, RequestRefused
from ..tokens import TOKEN_ENV, find_token
from ..urls import UrlOption
from .system import Out, SystemPeer
from .tokens import DirectoryTokens

__all__ = ["add_system"]

DEFAULT_URL = "ws://127.0.0.1:8765"


def add_system(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bcpbus system`` to the ``bcpbus`` parser's subparsers."""
    parser = sub.add_parser(
        "system",
        help="the system peer: start agents for chats' spawn requests and route chats to them",
        description=f"Run {SYSTEM_CLIENT_ID}: answer spawn_request on system:spawn by starting "
        "the agent's command: from its definition, with its token from --tokens-dir in its "
        "environment; answer spawn_result and route_assigned. Stops its agents on exit.",
    )
    parser.add_argument(
        "--url",
        action=UrlOption,
        default=DEFAULT_URL,
        help=f"the bus (default {DEFAULT_URL}); repeat it, or give a comma list, to fail over",
    )
    parser.add_argument("--token", help=f"{SYSTEM_CLIENT_ID}'s token (or ${TOKEN_ENV})")
    parser.add_argument("--token-file", type=Path, metavar="FILE", help="a file with the token")
    parser.add_argument(
        "--agents-dir",
        type=Path,
        help="agent definitions, the folder the bus reads (default ./agents)",
    )
    parser.add_argument(
        "--tokens-dir",
        type=Path,
        default=Path("agent-tokens"),
        metavar="DIR",
        help="agents' tokens, DIR/NAME.token, each chmod 600 (default ./agent-tokens)",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long an agent has to exit on shutdown before it is killed (default 5)",
    )
    parser.add_argument("--json", action="store_true", help="events as JSON lines")
    parser.set_defaults(command=_system)


def _system(args: argparse.Namespace) -> int:
    token = find_token(args.token, args.token_file)
    if token is None:
        raise ValueError(f"system: give --token-file FILE, --token TOKEN or ${TOKEN_ENV}")
    agents_dir = args.agents_dir or default_agents_dir()
    if agents_dir is None or not Path(agents_dir).is_dir():
        raise FileNotFoundError(f"system: no agents folder {agents_dir or './agents'}")
    out = _json_line if args.json else _text_line
    peer = Peer(args.url, SYSTEM_CLIENT_ID, token)
    system = SystemPeer(
        peer, agents_dir, DirectoryTokens(args.tokens_dir), out=out, stop_timeout=args.stop_timeout
    )
    return asyncio.run(_run(system, out))


async def _run(system: SystemPeer, out: Out) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    peer = system.peer

    def stop_on_refusal(event: ConnectionEvent) -> None:
        # The SDK reconnects after a restart; once the bus refuses the token (revoked, rotated)
        # it gives up, and waiting on would leave a peer that starts nothing and says nothing.
        if isinstance(event, GaveUp):
            stop.set()

    peer.on_connection = stop_on_refusal
    try:
        await system.start()
    except PeerError as exc:
        # ConnectFailed says "cannot connect to URL: ..."; a refusal needs the who and where.
        refused = f"the bus at {peer.url} refused {peer.client_id}: {exc}"
        out({"event": "error", "message": refused if isinstance(exc, RequestRefused) else str(exc)})
        await system.close()
        return 1
    try:
        await stop.wait()
    finally:
        await system.close()
        out({"event": "stopped"})
    if peer.gave_up is not None:
        out({"event": "error", "message": _revoked(peer)})
        return 2
    return 0


def _revoked(peer: Peer) -> str:
    who = peer.client_id
    return (
        f"the bus at {peer.url} no longer accepts {who}'s token: it was revoked or rotated; "
        f"get a new one (`bcpbus peers add {who}`, or `bcpbus peers rotate {who}` where it "
        "still has one) and start again"
    )


def _json_line(event: dict[str, Any]) -> None:
    print(json.dumps(event, ensure_ascii=False), flush=True)


def _text_line(event: dict[str, Any]) -> None:
    if event["event"] == "error":
        print(neutralize(f"bcpbus: error: {event['message']}"), file=sys.stderr, flush=True)
        return
    # Agents' output lines are theirs: shown with control characters escaped.
    details = " ".join(f"{key}={value}" for key, value in event.items() if key != "event")
    print(neutralize(f"{event['event']} {details}".rstrip()), flush=True)
