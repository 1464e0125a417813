"""The ``bcpbus mcp`` command: serve one peer's bus connection to an MCP host.

::

    bcpbus mcp --url ws://127.0.0.1:8765 --client-id agent:main --token-file main.token
    bcpbus mcp ... --http 8800          # streamable HTTP at http://127.0.0.1:8800/mcp

With ``--http`` the first line on stdout is ``listening on http://HOST:PORT/mcp`` (``--http 0``
picks a free port and this line names it).

The ``mcp`` SDK is imported when the command runs, not when ``bcpbus`` starts, so the other
commands work without the ``mcp`` extra installed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from bus.core.errors import BusError
from bus.core.identities import default_agents_dir
from schemas.agents import build_channels, load_agents

from ..client import Peer
from ..errors import PeerError
from ..tokens import TOKEN_ENV, find_token
from .bridge import Bridge
from .inbox import DEFAULT_INBOX_SIZE

__all__ = ["add_mcp"]


def add_mcp(sub: Any) -> None:
    """Add ``bcpbus mcp``."""
    parser = sub.add_parser(
        "mcp", help="serve a peer's bus connection to an MCP host (stdio, or HTTP with --http)"
    )
    parser.add_argument("--url", default="ws://127.0.0.1:8765", help="the bus")
    parser.add_argument("--client-id", required=True, help="the peer, such as agent:main")
    parser.add_argument("--token", help=f"the peer's token (or env {TOKEN_ENV})")
    parser.add_argument("--token-file", type=Path, help="a file holding the token")
    parser.add_argument(
        "--agents-dir", type=Path, help="agent definitions: the peer's BCP role (default ./agents)"
    )
    parser.add_argument(
        "--http",
        type=int,
        metavar="PORT",
        help="serve streamable HTTP on PORT (0: a free one), not stdio; prints "
        "'listening on http://HOST:PORT/mcp' when ready",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface for --http")
    parser.add_argument(
        "--inbox-size",
        type=int,
        default=DEFAULT_INBOX_SIZE,
        help=f"messages the inbox resource keeps (default {DEFAULT_INBOX_SIZE})",
    )
    parser.set_defaults(command=_mcp)


def _mcp(args: argparse.Namespace) -> int:
    try:
        from . import server
    except ImportError as exc:
        print(
            f"bcpbus: error: bcpbus mcp needs the mcp extra ({exc}): pip install 'bcpbus[mcp]'",
            file=sys.stderr,
        )
        return 2
    token = find_token(args.token, args.token_file)
    if token is None:
        raise ValueError(f"no token: pass --token, --token-file or set {TOKEN_ENV}")
    agents_dir = args.agents_dir or default_agents_dir()
    channels = build_channels(load_agents(agents_dir)) if agents_dir is not None else {}

    async def run() -> int:
        bridge = Bridge(Peer(args.url, args.client_id, token), channels, inbox_size=args.inbox_size)
        try:
            await bridge.start()
        except (PeerError, BusError) as exc:
            print(f"bcpbus: error: {args.client_id}: {exc}", file=sys.stderr)
            return 1
        try:
            if args.http is None:
                await server.serve_stdio(bridge)
            else:
                await server.serve_http(bridge, args.host, args.http)
        finally:
            await bridge.close()
        return 0

    return asyncio.run(run())
