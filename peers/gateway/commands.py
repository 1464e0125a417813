"""The ``bcpbus gateway``, ``bcpbus budget`` and ``bcpbus demo`` commands.

``bcpbus serve`` runs the gateway in its own process; ``bcpbus gateway`` runs it alone against a
bus elsewhere. ``bcpbus budget reset`` starts a channel's new budget session. ``bcpbus demo``
shows every BCP flow in one command.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
from pathlib import Path
from typing import Any

from bus.core.errors import AuthenticationFailed
from bus.core.identities import default_agents_dir
from bus.core.logevents import LogEvent
from bus.log.activity import ActivityLog
from bus.ops.config import AuditSettings
from bus.ops.startup import StartupError, check_db
from schemas.agents import build_channels, load_agents

from ..errors import ConnectFailed, InvalidURL, PeerTimeout
from ..tokens import TOKEN_ENV, find_token
from .settings import GatewaySettings

__all__ = ["add_budget", "add_demo", "add_gateway"]


def add_gateway(sub: Any) -> None:
    """Add ``bcpbus gateway``."""
    parser = sub.add_parser(
        "gateway",
        help="run the BCP gateway against a running bus",
        description="Run the BCP gateway alone, as system:gateway, against a bus elsewhere "
        "(`bcpbus serve --no-gateway`). SIGHUP, or a change to the agent definitions, reloads "
        "its channels; `bcpbus budget reset` takes effect within a second.",
    )
    _add_connection_options(parser)
    _add_limit_options(parser)
    parser.add_argument(
        "--log-content",
        choices=("full", "digest"),
        help="what its rows keep of questions, answers and values (default: the bus's, as its "
        "latest bus_start row says)",
    )
    parser.add_argument(
        "--audit-key", help="a version-1 log's HMAC key (default: the --db path + .key)"
    )
    parser.set_defaults(command=_gateway)


def _add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``bcpbus gateway``'s bus, credentials, database and agent definitions."""
    parser.add_argument(
        "--url", default="ws://127.0.0.1:8765", help="the bus (default ws://127.0.0.1:8765)"
    )
    parser.add_argument(
        "--token", help=f"system:gateway's token (or --token-file, or ${TOKEN_ENV})"
    )
    parser.add_argument("--token-file", type=Path, help="a file holding the token")
    parser.add_argument(
        "--cafile", type=Path, help="for wss://, trust the CA certificates in this PEM file"
    )
    parser.add_argument(
        "--db",
        type=Path,
        default=Path("bcpbus.db"),
        help="the activity log the gateway records to and restores from (default ./bcpbus.db)",
    )
    parser.add_argument("--agents-dir", type=Path, help="agent definitions (default ./agents)")


def _add_limit_options(parser: argparse.ArgumentParser) -> None:
    """``bcpbus gateway``'s timeouts and retries, defaulting to :class:`GatewaySettings`'."""
    defaults = GatewaySettings()
    parser.add_argument(
        "--query-ttl",
        type=float,
        default=defaults.query_ttl,
        help=f"seconds a query may wait for a valid answer (default {defaults.query_ttl:g})",
    )
    parser.add_argument(
        "--max-retries",
        type=int,
        default=defaults.max_retries,
        help=f"invalid answers a reader may send per query (default {defaults.max_retries})",
    )
    parser.add_argument(
        "--approval-timeout",
        type=float,
        default=defaults.approval_timeout,
        help="seconds a human has to decide an approval; then it is rejected "
        f"(default {defaults.approval_timeout:g})",
    )
    parser.add_argument(
        "--outbox-ttl",
        type=float,
        default=defaults.outbox_ttl,
        help=f"seconds a push waits for an offline controller (default {defaults.outbox_ttl:g})",
    )
    parser.add_argument(
        "--screener-timeout",
        type=float,
        default=defaults.screener_timeout,
        help="seconds the gateway waits for a channel's screeners' verdicts "
        f"(default {defaults.screener_timeout:g})",
    )


def _gateway(args: argparse.Namespace) -> int:
    from .runner import run_standalone

    token = find_token(args.token, args.token_file)
    if token is None:
        raise ValueError(
            f"no token: pass --token-file FILE, --token, or set {TOKEN_ENV} (`bcpbus peers add "
            "system:gateway` makes one)"
        )
    agents_dir = args.agents_dir or default_agents_dir()
    if agents_dir is None:
        raise FileNotFoundError("no agents directory: pass --agents-dir")
    check_db(args.db)
    settings = _settings(args)
    try:
        return asyncio.run(
            run_standalone(
                args.url,
                token,
                args.db,
                agents_dir,
                settings,
                cafile=args.cafile,
                log_content=args.log_content,
                audit=AuditSettings(key_file=args.audit_key),
            )
        )
    except AuthenticationFailed:
        raise ValueError(
            f"the bus at {args.url} refused system:gateway's token: check --token or "
            "--token-file, or make one with `bcpbus peers add system:gateway` (`peers rotate "
            "system:gateway` where it is listed already)"
        ) from None
    except InvalidURL as exc:
        raise ValueError(
            f"--url {args.url}: {exc.detail}: give the bus's address, e.g. ws://127.0.0.1:8765"
        ) from None
    except (ConnectFailed, PeerTimeout) as exc:
        raise ValueError(
            f"--url {args.url}: {exc}: is the bus running there (`bcpbus serve --no-gateway`)?"
        ) from None


def _settings(args: argparse.Namespace) -> GatewaySettings:
    """The gateway's settings from ``bcpbus gateway``'s options.

    Raises:
        ValueError: a timeout or retry count is negative or not finite; the message names it.
    """
    names = ("query_ttl", "max_retries", "approval_timeout", "outbox_ttl", "screener_timeout")
    limits = {name: getattr(args, name) for name in names}
    for name, value in limits.items():
        if not 0 <= value < math.inf:
            raise ValueError(f"--{name.replace('_', '-')} {value}: give a number from 0 up")
    return GatewaySettings(**limits)


def add_budget(sub: Any) -> None:
    """Add ``bcpbus budget reset``."""
    parser = sub.add_parser(
        "budget",
        help="BCP budget sessions",
        description="Manage the BCP channels' bit budgets.",
    )
    actions = parser.add_subparsers(title="actions", metavar="ACTION", required=True)
    reset = actions.add_parser(
        "reset",
        help="start a new budget session for a channel (a running gateway applies it at once)",
        description="Write a bcp_budget_reset row for bcp:CONTROLLER:READER: the channel's bits "
        "and Cat-2 queries count from zero again. A running gateway reading the same activity "
        "log applies it within a second.",
    )
    reset.add_argument("controller", metavar="CONTROLLER", help="the controller's agent name")
    reset.add_argument("reader", metavar="READER", help="the reader's agent name")
    reset.add_argument(
        "--db",
        type=Path,
        default=Path("bcpbus.db"),
        help="the activity log the gateway uses (default ./bcpbus.db)",
    )
    reset.add_argument(
        "--agents-dir",
        type=Path,
        help="agent definitions that define the channel (default ./agents)",
    )
    reset.add_argument(
        "--by",
        default=f"operator:{os.environ.get('USER', 'unknown')}",
        help="who resets, for the audit row (default operator:$USER)",
    )
    reset.add_argument(
        "--audit-key", help="a version-1 log's HMAC key (default: the --db path + .key)"
    )
    reset.set_defaults(command=_budget_reset)


def _budget_reset(args: argparse.Namespace) -> int:
    agents_dir = args.agents_dir or default_agents_dir()
    channels = build_channels(load_agents(agents_dir)) if agents_dir else {}
    if (args.controller, args.reader) not in channels:
        known = ", ".join(f"{c} {r}" for c, r in sorted(channels)) or "none"
        raise ValueError(
            f"no channel bcp:{args.controller}:{args.reader} is defined in {agents_dir}: give "
            f"CONTROLLER READER of a defined channel ({known})"
        )
    if not args.db.is_file():
        # A reset goes into the log the gateway reads; a new empty file would be read by no one.
        what = "is a directory" if args.db.is_dir() else "does not exist"
        raise StartupError(
            f"--db {args.db} {what}: give the activity log the bus and its gateway write "
            "(`bcpbus serve --db`, ./bcpbus.db by default), e.g. --db /path/to/bcpbus.db"
        )
    check_db(args.db)
    topic = f"bcp:{args.controller}:{args.reader}"

    async def write() -> None:
        async with ActivityLog(args.db, key_file=args.audit_key) as log:
            await log.write(
                LogEvent.BCP_BUDGET_RESET,
                actor=args.by,
                topic=topic,
                status="reset",
                payload={"channel": topic},
            )

    asyncio.run(write())
    print(f"{topic}: a new budget session starts; a running gateway applies it within a second")
    return 0


def add_demo(sub: Any) -> None:
    """Add ``bcpbus demo``."""
    parser = sub.add_parser("demo", help="run every BCP flow on the reference agents and show it")
    parser.add_argument(
        "--yes", action="store_true", help="approve every approval request (for scripts)"
    )
    parser.add_argument(
        "--db", type=Path, metavar="FILE", help="keep the activity log in FILE (a new file)"
    )
    parser.set_defaults(command=_demo)


def _demo(args: argparse.Namespace) -> int:
    from peers.demo import run_demo

    if args.db is not None:
        check_db(args.db)

    def out(line: str) -> None:
        print(line, flush=True)

    return run_demo(yes=args.yes, db=args.db, out=out)
