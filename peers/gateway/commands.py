"""The ``bcpbus gateway``, ``bcpbus budget`` and ``bcpbus demo`` commands.

``bcpbus serve`` runs the gateway in its own process; ``bcpbus gateway`` runs it alone against a
bus elsewhere. ``bcpbus budget reset`` starts a channel's new budget session. ``bcpbus demo``
shows every BCP flow in one command.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from bus.activity import ActivityLog
from bus.identities import default_agents_dir
from schemas.agents import build_channels, load_agents

from ..tokens import TOKEN_ENV, find_token
from .settings import GatewaySettings

__all__ = ["add_budget", "add_demo", "add_gateway"]


def add_gateway(sub: Any) -> None:
    """Add ``bcpbus gateway``."""
    parser = sub.add_parser("gateway", help="run the BCP gateway against a running bus")
    parser.add_argument("--url", default="ws://127.0.0.1:8765", help="the bus")
    parser.add_argument("--token", help=f"system:gateway's token (or env {TOKEN_ENV})")
    parser.add_argument("--token-file", type=Path, help="a file holding the token")
    parser.add_argument("--db", type=Path, default=Path("bcpbus.db"), help="activity log")
    parser.add_argument("--agents-dir", type=Path, help="agent definitions (default ./agents)")
    parser.add_argument("--query-ttl", type=float, default=GatewaySettings.query_ttl)
    parser.add_argument("--max-retries", type=int, default=GatewaySettings.max_retries)
    parser.add_argument("--approval-timeout", type=float, default=GatewaySettings.approval_timeout)
    parser.add_argument("--outbox-ttl", type=float, default=GatewaySettings.outbox_ttl)
    parser.add_argument("--screener-timeout", type=float, default=GatewaySettings.screener_timeout)
    parser.set_defaults(command=_gateway)


def _gateway(args: argparse.Namespace) -> int:
    from .runner import run_standalone

    token = find_token(args.token, args.token_file)
    if token is None:
        raise ValueError(f"no token: pass --token, --token-file or set {TOKEN_ENV}")
    agents_dir = args.agents_dir or default_agents_dir()
    if agents_dir is None:
        raise FileNotFoundError("no agents directory: pass --agents-dir")
    settings = GatewaySettings(
        query_ttl=args.query_ttl,
        max_retries=args.max_retries,
        approval_timeout=args.approval_timeout,
        outbox_ttl=args.outbox_ttl,
        screener_timeout=args.screener_timeout,
    )
    return asyncio.run(run_standalone(args.url, token, args.db, agents_dir, settings))


def add_budget(sub: Any) -> None:
    """Add ``bcpbus budget reset``."""
    parser = sub.add_parser("budget", help="BCP budget sessions")
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    reset = actions.add_parser(
        "reset", help="start a new budget session for a channel (takes effect at gateway start)"
    )
    reset.add_argument("controller", metavar="CONTROLLER")
    reset.add_argument("reader", metavar="READER")
    reset.add_argument("--db", type=Path, default=Path("bcpbus.db"))
    reset.add_argument("--agents-dir", type=Path)
    reset.add_argument("--by", default=f"operator:{os.environ.get('USER', 'unknown')}")
    reset.set_defaults(command=_budget_reset)


def _budget_reset(args: argparse.Namespace) -> int:
    agents_dir = args.agents_dir or default_agents_dir()
    channels = build_channels(load_agents(agents_dir)) if agents_dir else {}
    if (args.controller, args.reader) not in channels:
        raise ValueError(f"no channel bcp:{args.controller}:{args.reader} is defined")
    topic = f"bcp:{args.controller}:{args.reader}"

    async def write() -> None:
        async with ActivityLog(args.db) as log:
            await log.write(
                "bcp_budget_reset",
                actor=args.by,
                topic=topic,
                status="reset",
                payload={"channel": topic},
            )

    asyncio.run(write())
    print(f"{topic}: a new budget session starts; restart the gateway for it to take effect")
    return 0


def add_demo(sub: Any) -> None:
    """Add ``bcpbus demo``."""
    parser = sub.add_parser("demo", help="run every BCP flow on the reference agents and show it")
    parser.add_argument(
        "--yes", action="store_true", help="approve every approval request (for scripts)"
    )
    parser.add_argument("--db", type=Path, help="keep the activity log in FILE")
    parser.set_defaults(command=_demo)


def _demo(args: argparse.Namespace) -> int:
    from peers.demo import run_demo

    def out(line: str) -> None:
        print(line, flush=True)

    return run_demo(yes=args.yes, db=args.db, out=out)
