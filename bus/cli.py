"""The bus's part of the ``bcpbus`` command: serve the bus, manage peer credentials, read the
activity log.

:func:`main` runs these commands alone (``python -m bus``: the bus with no gateway);
:mod:`peers.cli`, which sees every layer, calls it with the peers' commands and the gateway to
run beside the bus, and is the ``bcpbus`` script. The bus never imports a peer: a command that
fails to import fails there, loudly, instead of going missing.

Run ``bcpbus --help`` for the list of commands and ``bcpbus COMMAND --help`` for each one.
Like :mod:`peers.cli`, this module reads the environment and prints to the terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sqlite3
import ssl
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeAlias

from schemas.agents import load_agents

from . import __version__
from .assemble import HttpListenFailed, door_for, running
from .compiled import VersionAction
from .core.errors import BusError
from .core.identities import PeerIdentity, default_agents_dir, load_identities
from .core.policy import Policy, PolicyError
from .log import audit, merged
from .log.chain_v1 import default_key_path
from .log.checkpoints import create_signing_key, default_checkpoints_path, load_signing_key
from .ops import completion
from .ops.config import AuditSettings, ClusterSettings, ConfigError, ServeConfig
from .ops.credentials import Credentials, CredentialsError, validate_webhook_url
from .ops.memory import return_large_blocks
from .ops.reload import BusFiles, Reloader
from .ops.starter import write_starter
from .ops.startup import (
    StartupError,
    check_db,
    check_http_extra,
    check_port,
    explain_bind,
    explain_db,
    summary,
)
from .ops.tls import server_context
from .server import Bus
from .transports.cluster import ClusterLink, joined
from .transports.egress import private_host

__all__ = [
    "Beside",
    "Commands",
    "RunBeside",
    "actions_of",
    "default_signing_key_path",
    "main",
    "serve",
]

logger = logging.getLogger("bus.cli")

Command = Callable[[argparse.Namespace], int]

Commands: TypeAlias = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
"""Adds more commands to the ``bcpbus`` parser's subparsers."""

RunBeside: TypeAlias = Callable[[Bus, Reloader], AbstractAsyncContextManager[object]]
"""Runs something beside a started bus for the duration of an ``async with`` block; what it
reads from files it adds to the reloader (:mod:`bus.ops.reload`)."""

Beside: TypeAlias = Callable[[ServeConfig], RunBeside | None]
"""Given the serve config, what ``serve`` runs beside the bus (the BCP gateway), or None.

Called before the bus starts, so that a bad config section is an error before anything listens.
"""


def main(
    argv: Sequence[str] | None = None,
    *,
    extend: Commands | None = None,
    beside: Beside | None = None,
) -> int:
    """Run the ``bcpbus`` command line; return the exit code.

    Args:
        argv: the arguments; default ``sys.argv[1:]``.
        extend: adds the commands of the layers above the bus (:mod:`peers.cli`).
        beside: what ``serve`` runs beside the bus; None serves the bus alone.
    """
    parser = _parser(extend, beside)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO if args.info else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    command: Command = args.command
    try:
        return command(args)
    except BrokenPipeError:
        # The reader went away (`bcpbus audit --format jsonl | head`): end quietly, as a
        # program killed by SIGPIPE would (Python docs, "Note on SIGPIPE").
        return _reader_gone()
    except (ConfigError, PolicyError, CredentialsError, OSError, ValueError) as exc:
        print(f"bcpbus: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (BusError, sqlite3.Error) as exc:
        print(f"bcpbus: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        return 130


def _reader_gone() -> int:
    """Point stdout at /dev/null, so that the interpreter's last flush at exit does not fail
    again, and return the exit code of a process ended by SIGPIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def _one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (a YAML error quotes the file over several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _parser(extend: Commands | None, beside: Beside | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bcpbus",
        description="A JSON-RPC 2.0 message bus over WebSocket for the Bandwidth-Constrained "
        "Protocol.",
    )
    parser.add_argument("--version", action=VersionAction, version=f"bcpbus {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    parser.add_argument("--info", action="store_true", help="info logging on stderr")

    def usage(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(command=usage)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_serve(sub, beside)
    _add_init(sub)
    _add_peers(sub)
    _add_audit(sub)
    if extend is not None:
        extend(sub)
    _add_completion(sub, parser)  # last: it completes every command added before it
    return parser


def actions_of(parser: argparse.ArgumentParser) -> Any:
    """The subparsers of ``parser`` (``bcpbus peers``' actions), to add more to them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise LookupError(f"{parser.prog} has no subcommands")


def _add_serve(sub: Any, beside: Beside | None) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the bus (and the BCP gateway)",
        description="Run the bus, and the BCP gateway beside it, until SIGINT or SIGTERM. "
        "SIGHUP, or a change to the peers file, the policy or the agent definitions, reloads "
        "them without a restart.",
    )
    serve.add_argument("--config", type=Path, help="YAML config file (see README)")
    serve.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port; 0 picks a free one (default 8765)")
    serve.add_argument(
        "--http-port",
        type=int,
        help="also serve the HTTP binding (POST /v1/messages, webhooks, /metrics) on this port; "
        "0 picks a free one (needs pip install 'bcpbus[http]')",
    )
    serve.add_argument("--db", type=Path, help="SQLite activity log (default ./bcpbus.db)")
    serve.add_argument("--peers-file", type=Path, help="credentials (default ./bcpbus-peers.yaml)")
    serve.add_argument("--policy", type=Path, help="authorization policy YAML (default: built in)")
    serve.add_argument(
        "--agents-dir",
        type=Path,
        help="agent definitions (default ./agents, else the packaged reference agents)",
    )
    _add_audit_options(serve)
    serve.add_argument("--no-gateway", action="store_true", help="do not start the BCP gateway")
    serve.add_argument(
        "--certfile",
        type=Path,
        help="TLS certificate chain (PEM): serve wss:// instead of ws:// (with --keyfile)",
    )
    serve.add_argument(
        "--keyfile", type=Path, help="the TLS certificate's private key (PEM; with --certfile)"
    )
    serve.add_argument(
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        default="auto",
        help="event loop: uvloop when installed (auto, the default), or one of them",
    )
    serve.add_argument(
        "--transport",
        choices=("websockets", "picows"),
        help="what serves WebSocket peers: websockets (the default) or picows (needs "
        "pip install 'bcpbus[picows]')",
    )
    _add_cluster(serve)
    serve.set_defaults(command=_serve, beside=beside)


def _add_audit_options(serve: argparse.ArgumentParser) -> None:
    """``serve``'s options for what the activity log keeps and how it is chained and signed."""
    serve.add_argument(
        "--log-content",
        choices=("full", "digest"),
        help="what the log keeps of each message: the whole envelope (full, the default) or "
        "its type and SHA-256 (digest)",
    )
    serve.add_argument(
        "--audit-key",
        help="the key of a log an earlier version chained (default: the --db path plus .key)",
    )
    serve.add_argument(
        "--signing-key",
        metavar="PATH",
        help="the Ed25519 key that signs the log's checkpoints, 0600 (`bcpbus audit keygen`; "
        "default ~/.config/bcpbus/signing.key, made on first use)",
    )
    serve.add_argument(
        "--audit-checkpoints",
        metavar="FILE",
        help="append signed checkpoints to FILE (default: the --db path plus .checkpoints)",
    )
    serve.add_argument(
        "--audit-syslog",
        metavar="ADDRESS",
        help="send each checkpoint to syslog as well: HOST:PORT (UDP) or a socket such as /dev/log",
    )
    serve.add_argument(
        "--no-checkpoints", action="store_true", help="sign no checkpoints of the activity log"
    )
    serve.add_argument(
        "--audit-head",
        metavar="FILE",
        help="append the log's head (ID:HASH) to FILE, or - for stdout, as rows are written",
    )
    serve.add_argument(
        "--audit-head-rows", type=int, metavar="N", help="rows between heads and checkpoints"
    )
    serve.add_argument(
        "--audit-head-seconds", type=float, metavar="S", help="most seconds a new head waits"
    )
    serve.add_argument(
        "--accept-broken-log",
        action="store_true",
        help="start even if the log's chain or triggers show a change: record it in a row and "
        "start a new chain segment",
    )


def _add_cluster(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--cluster",
        metavar="nats://HOST:PORT",
        help="be one node of a cluster of buses on this NATS server (docs/cluster.md; needs "
        "pip install 'bcpbus[cluster]')",
    )
    serve.add_argument(
        "--node", metavar="NAME", help="this node's name in the cluster (default: the host name)"
    )


def _add_init(sub: Any) -> None:
    init = sub.add_parser(
        "init",
        help="write a starter directory: agents/, policy, peers file and config",
        description="Write DIR/agents/ (the reference agents), DIR/policy.yaml (the built-in "
        "policy), an empty DIR/bcpbus-peers.yaml and DIR/bcpbus.yaml pointing at them; then "
        "run `bcpbus serve --config DIR/bcpbus.yaml`. Existing files are never overwritten.",
    )
    init.add_argument("directory", metavar="DIR", type=Path, help="where to write (created)")
    init.set_defaults(command=_init)


def _add_peers(sub: Any) -> None:
    peers = sub.add_parser(
        "peers",
        help="manage peer credentials; list the peers online",
        description="Create, rotate, list and remove the tokens peers connect with. A running "
        "bus reads the peers file again within a second of a change.",
    )
    peers.add_argument(
        "--peers-file",
        type=Path,
        default=Path("bcpbus-peers.yaml"),
        help="the peers file (default ./bcpbus-peers.yaml)",
    )
    peers_sub = peers.add_subparsers(title="actions", metavar="ACTION", required=True)
    _add_peers_add(peers_sub)
    rotate = peers_sub.add_parser(
        "rotate", help="give CLIENT_ID a new token, print it once; the old one stops working"
    )
    rotate.add_argument("client_id", metavar="CLIENT_ID", help="an existing clientId")
    rotate.set_defaults(command=_peers_rotate)
    lst = peers_sub.add_parser("list", help="list clientIds and roles (never tokens)")
    lst.set_defaults(command=_peers_list)
    rm = peers_sub.add_parser(
        "remove", help="delete CLIENT_ID's credential (its connection is closed, 4005)"
    )
    rm.add_argument("client_id", metavar="CLIENT_ID", help="an existing clientId")
    rm.set_defaults(command=_peers_remove)


def _add_peers_add(peers_sub: Any) -> None:
    """``bcpbus peers add``: a new clientId's token, its roles, a webhook peer's URL."""
    add = peers_sub.add_parser(
        "add", help="create a token for a new CLIENT_ID, print it once (--rotate: replace one)"
    )
    add.add_argument("client_id", metavar="CLIENT_ID", help="prefix:name, e.g. agent:w1")
    _role_options(add)
    add.add_argument(
        "--rotate",
        action="store_true",
        help="replace the token of an existing CLIENT_ID (its connection is closed, 4005)",
    )
    add.add_argument(
        "--webhook",
        metavar="URL",
        help="a peer the bus reaches over HTTP: its deliveries are POSTed to URL, signed with a "
        "secret printed on the second line",
    )
    add.add_argument(
        "--subscribe",
        action="append",
        default=[],
        metavar="PATTERN",
        help="with --webhook: a topic pattern it is subscribed to when the bus starts "
        "(repeatable; its own clientId always is)",
    )
    add.add_argument(
        "--allow-private-webhook",
        action="store_true",
        help="with --webhook: accept a URL at a loopback, private or link-local address (the bus "
        "also needs http.allow_private_webhooks: true to call it)",
    )
    add.set_defaults(command=_peers_add)


def _role_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--role", action="append", default=[], help="a policy role to assign (repeatable)"
    )
    parser.add_argument(
        "--policy", type=Path, help="check the roles against this policy (default: built in)"
    )


def _add_audit(sub: Any) -> None:
    aud = sub.add_parser(
        "audit",
        help="read and verify the activity log",
        description="Read the activity log (filters, --bits, --refusals, --query, --follow), or "
        "check it: `bcpbus audit verify`, `bcpbus audit head`.",
    )
    aud.add_argument(
        "--db",
        type=Path,
        action="append",
        help="activity log (default ./bcpbus.db); repeat it for the nodes of a cluster: their "
        "rows are merged by time, each with its node",
    )
    aud.add_argument("--message-id", help="rows of one message")
    aud.add_argument("--topic", help="topic pattern, '*' segments allowed")
    aud.add_argument("--actor", help="clientId")
    aud.add_argument("--since", help="ISO-8601 date or time, inclusive")
    aud.add_argument("--until", help="ISO-8601 date or time, exclusive")
    aud.add_argument("--event", help="event name, e.g. send_start, refused")
    aud.add_argument("--limit", type=int, default=1000, help="most rows shown (default 1000)")
    aud.add_argument(
        "--bits", action="store_true", help="bits charged, refunded, delivered per BCP channel"
    )
    aud.add_argument("--refusals", action="store_true", help="refusals per reason")
    aud.add_argument(
        "--query", metavar="QUERY_ID", help="one BCP query: question, raw answer, value delivered"
    )
    aud.add_argument(
        "--follow", action="store_true", help="print new rows as they come, like tail -f"
    )
    aud.add_argument(
        "--format",
        choices=("table", "json", "jsonl"),
        default="table",
        help="a table (default), one JSON array, or JSON Lines (one object per row)",
    )
    aud.add_argument("--json", action="store_true", help="same as --format json")
    aud.set_defaults(command=_audit)
    _add_audit_checks(aud.add_subparsers(title="checking the log", metavar="ACTION"))


def _add_audit_checks(actions: Any) -> None:
    """``bcpbus audit verify``, ``keygen``, ``pubkey`` and ``head``: checking the log rather
    than reading it."""
    _add_audit_verify(actions)
    _add_audit_keys(actions)
    head = actions.add_parser("head", help="print the last row's ID:HASH")
    head.add_argument(
        "--db", type=Path, action="append", default=argparse.SUPPRESS, help="activity log"
    )
    head.set_defaults(command=_audit_head)


def _add_audit_verify(actions: Any) -> None:
    """``bcpbus audit verify``: rows, chain, checkpoints and a head kept elsewhere."""
    verify = actions.add_parser(
        "verify", help="check the hash chain: exit 0 if intact, 1 naming the first bad row"
    )
    # SUPPRESS: `audit --db X verify` keeps X; `audit verify --db X` works too.
    verify.add_argument(
        "--db",
        type=Path,
        action="append",
        default=argparse.SUPPRESS,
        help="activity log; repeat it to verify each node's log of a cluster",
    )
    verify.add_argument(
        "--pubkey",
        type=Path,
        metavar="FILE",
        help="the .pub of the key the bus signs checkpoints with: check them too",
    )
    verify.add_argument(
        "--checkpoints",
        type=Path,
        action="append",
        metavar="FILE",
        help="a checkpoint file (repeatable; default: DB.checkpoints)",
    )
    verify.add_argument(
        "--key",
        type=Path,
        help="the key of rows an earlier version chained, to check each (default: DB.key if "
        "there is one)",
    )
    verify.add_argument(
        "--expect-head", metavar="ID:HASH", help="a head kept elsewhere: catches a cut tail"
    )
    verify.add_argument(
        "--from",
        dest="start",
        type=int,
        default=0,
        metavar="ID",
        help="report nothing before this chain_start row (a segment after an accepted break)",
    )
    verify.set_defaults(command=_audit_verify)


def _add_audit_keys(actions: Any) -> None:
    """``bcpbus audit keygen`` and ``pubkey``: the key checkpoints are signed with."""
    keygen = actions.add_parser(
        "keygen",
        help="make a key to sign checkpoints with: PATH (0600) and PATH.pub for auditors",
    )
    keygen.add_argument("--out", type=Path, required=True, metavar="PATH", help="the new key")
    keygen.add_argument(
        "--name",
        help="the key's name, the checkpoints' origin (default: HOSTNAME/bcpbus)",
    )
    keygen.set_defaults(command=_audit_keygen)
    pubkey = actions.add_parser(
        "pubkey",
        help="print a signing key's verifier key, the line its lost .pub held",
        description="Print the verifier key (NAME+KEYID+...) of the signing key at KEY: "
        "`bcpbus audit pubkey KEY > KEY.pub` makes its .pub again.",
    )
    pubkey.add_argument("key", type=Path, metavar="KEY", help="the signing key (mode 0600)")
    pubkey.set_defaults(command=_audit_pubkey)


def _add_completion(sub: Any, root: argparse.ArgumentParser) -> None:
    comp = sub.add_parser(
        "completion",
        help="print a shell completion script: source <(bcpbus completion bash)",
        description="Print the completion script for SHELL, generated from this command line: "
        "add `source <(bcpbus completion bash)` to ~/.bashrc, or `source <(bcpbus completion "
        "zsh)` to ~/.zshrc after compinit.",
    )
    comp.add_argument("shell", metavar="SHELL", choices=completion.SHELLS, help="bash or zsh")
    comp.set_defaults(command=_completion, root=root)


def _completion(args: argparse.Namespace) -> int:
    print(completion.script(args.root, args.shell), end="")
    return 0


# serve


def _serve(args: argparse.Namespace) -> int:
    config = _config_of(args)
    beside: Beside | None = args.beside
    if args.no_gateway:
        # What runs beside still runs (the console, with --http-port); the gateway does not.
        config = replace(config, gateway={**config.gateway, "enabled": False})
    elif beside is None:
        print(
            "bcpbus: note: this command line serves the bus alone, without the BCP gateway; "
            "`bcpbus serve` runs both",
            file=sys.stderr,
        )
    return_large_blocks()  # the memory of large messages goes back once they are gone
    return _run(serve(config, beside=beside), args.loop)


def _config_of(args: argparse.Namespace) -> ServeConfig:
    """The config file's settings (``--config``), overridden by the options given."""
    config = ServeConfig.load(args.config) if args.config else ServeConfig()
    overrides = {
        key: value
        for key, value in {
            "host": args.host,
            "port": args.port,
            "db": args.db,
            "peers_file": args.peers_file,
            "policy": args.policy,
            "agents_dir": args.agents_dir,
            "certfile": args.certfile,
            "keyfile": args.keyfile,
            "log_content": args.log_content,
            "transport": args.transport,
        }.items()
        if value is not None
    }
    config = replace(config, **overrides)
    chain = {
        key: value
        for key, value in {
            "key_file": args.audit_key,
            "signing_key": args.signing_key,
            "checkpoints": args.audit_checkpoints,
            "syslog": args.audit_syslog,
            "sign": False if args.no_checkpoints else None,
            "head": args.audit_head,
            "head_every_rows": args.audit_head_rows,
            "head_every_seconds": args.audit_head_seconds,
        }.items()
        if value is not None
    }
    config = replace(
        config,
        audit=_default_signing_key(replace(config.audit, **chain)),
        accept_broken_log=args.accept_broken_log or config.accept_broken_log,
    )
    if args.http_port is not None:
        config = replace(config, http=replace(config.http, port=args.http_port))
    return _with_cluster(config, args)


def _with_cluster(config: ServeConfig, args: argparse.Namespace) -> ServeConfig:
    """``config`` with ``--cluster`` and ``--node`` applied over its ``cluster:`` section."""
    if args.cluster is None and args.node is None:
        return config
    url, node = args.cluster or config.cluster.url, args.node or config.cluster.node
    if url is None:
        raise ConfigError("--node names a cluster node: give --cluster nats://HOST:PORT too")
    return replace(config, cluster=ClusterSettings(url=url, node=node))


def _run(coro: Coroutine[Any, Any, int], loop: str = "auto") -> int:
    """Run ``coro`` on ``loop``: ``auto`` is uvloop when installed (the ``speed`` extra).

    Raises:
        StartupError: ``uvloop`` was asked for and is not installed.
    """
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                coro.close()
                raise StartupError(
                    "--loop uvloop: uvloop is not installed: pip install 'bcpbus[speed]', or "
                    "give --loop asyncio"
                ) from None
        else:
            result: int = uvloop.run(coro)
            return result
    # Outside the except block: an error of the bus's own is not chained to the ImportError.
    return asyncio.run(coro)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def serve(
    config: ServeConfig,
    *,
    ready: Callable[[Bus], None] | None = None,
    beside: Beside | None = None,
    say: Callable[[str], None] = _stderr,
) -> int:
    """Run the bus, and what ``beside`` gives, until SIGINT or SIGTERM; flush the activity log
    before returning 0.

    The first line on stdout is ``listening on ws://HOST:PORT`` (``wss://`` with TLS), printed
    when the bus and what runs beside it (the gateway) are ready (with the HTTP binding,
    ``http on http://HOST:PORT`` follows it); the start-up summary comes
    before it, on stderr (through ``say``). SIGHUP, or a change to the peers file, the policy
    or the agent definitions, reloads them (:mod:`bus.ops.reload`).

    Raises:
        StartupError: the port, the database path or the TLS files cannot be used; the
            message is one line naming the option.
        ConfigError: ``beside`` refused a section of the config.
    """
    config = _checked(config)
    agents_dir = config.agents_dir
    tls = server_context(config.certfile, config.keyfile)
    run_beside = beside(config) if beside is not None else None
    policy = Policy.load(config.policy) if config.policy else Policy.default()
    credentials = Credentials.load(config.peers_file)
    agents = load_agents(agents_dir) if agents_dir is not None and agents_dir.is_dir() else {}
    _note_offline_webhooks(credentials, config)
    identities = load_identities(agents_dir) if agents_dir is not None else {}
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        bus = await _start(stack, config, credentials, policy, identities, tls)
        link = await _join_cluster(stack, bus, config)
        reloader = Reloader(bus.log, say=say)
        reloader.add(
            BusFiles(bus, peers_file=config.peers_file, policy=config.policy, agents_dir=agents_dir)
        )
        if run_beside is not None:
            await stack.enter_async_context(run_beside(bus, reloader))
        loop.add_signal_handler(signal.SIGHUP, _on_hup(reloader, link))
        await stack.enter_async_context(reloader)
        _say_ready(bus, config, policy, agents, gateway=run_beside is not None, say=say)
        if ready is not None:
            ready(bus)
        await stop.wait()
    return 0


async def _join_cluster(
    stack: contextlib.AsyncExitStack, bus: Bus, config: ServeConfig
) -> ClusterLink | None:
    """Join the cluster the config names (its link stays up until ``stack`` closes)."""
    if config.cluster.url is None:
        return None
    return await stack.enter_async_context(
        joined(bus, url=config.cluster.url, node=config.cluster.node)
    )


def _on_hup(reloader: Reloader, link: ClusterLink | None) -> Callable[[], None]:
    """What SIGHUP does: reload this bus's files; on a cluster node, every node's (and the
    other nodes' reloads reach this one)."""
    if link is None:
        return reloader.trigger
    link.follow(reloader)
    return link.reload_everywhere


def _checked(config: ServeConfig) -> ServeConfig:
    """``config`` with its agent definitions' folder, once the port, the HTTP extra and the
    database path are usable (else a :class:`StartupError` naming the option)."""
    config = replace(config, agents_dir=config.agents_dir or default_agents_dir())
    check_port(config.port)
    if config.http.port is not None:
        check_http_extra(config.http.port)
    check_db(config.db)
    try:
        door_for(config.transport)
    except ImportError as exc:
        raise StartupError(str(exc)) from None
    return config


def _note_offline_webhooks(credentials: Credentials, config: ServeConfig) -> None:
    """Say on stderr that webhook peers stay offline when the HTTP binding is off."""
    hooks = [r.client_id for r in credentials.records() if r.webhook is not None]
    if hooks and config.http.port is None:
        print(
            f"bcpbus: note: {len(hooks)} webhook peer(s) ({', '.join(hooks[:3])}) stay offline: "
            "the bus reaches webhooks only with the HTTP binding on (--http-port)",
            file=sys.stderr,
        )


def _say_ready(
    bus: Bus,
    config: ServeConfig,
    policy: Policy,
    agents: Mapping[str, Any],
    *,
    gateway: bool,
    say: Callable[[str], None],
) -> None:
    """The start-up summary through ``say``, then ``listening on`` (and ``http on``) on
    stdout: the lines that tell a caller the bus, and what runs beside it, are ready."""
    agents_dir = config.agents_dir
    for line in summary(
        policy=str(config.policy or "built in (bus/default_policy.yaml)"),
        roles=len(policy.roles),
        peers_file=config.peers_file,
        peers=len(Credentials.load(config.peers_file)),
        agents_dir=agents_dir,
        agents=agents,
        gateway=gateway and config.gateway.get("enabled", True) is not False,
        db=config.db,
        log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        checkpoints=_checkpoints_line(config),
    ):
        say(f"bcpbus: {line}")
    # Printed once the gateway is subscribed too: "listening" means ready for BCP.
    print(f"listening on {bus.url}", flush=True)
    if bus.http_url is not None:
        print(f"http on {bus.http_url}", flush=True)
    bus.log.release_heads()  # heads on stdout (--audit-head -) come after those lines


async def _start(
    stack: contextlib.AsyncExitStack,
    config: ServeConfig,
    credentials: Credentials,
    policy: Policy,
    identities: Mapping[str, PeerIdentity],
    tls: ssl.SSLContext | None,
) -> Bus:
    """Open the log and start the bus on ``stack``; say in one line what stops either."""
    try:
        return await stack.enter_async_context(
            running(
                config.db,
                credentials=credentials,
                policy=policy,
                identities=identities,
                limits=config.limits,
                server_id=config.server_id,
                log_content=config.log_content,
                audit=config.audit,
                accept_broken_log=config.accept_broken_log,
                host=config.host,
                port=config.port,
                ssl=tls,
                http=config.http,
                transport=config.transport,
            )
        )
    except sqlite3.Error as exc:
        raise explain_db(exc, config.db) from exc
    except HttpListenFailed as exc:
        assert config.http.port is not None  # only a binding that was asked for fails
        raise explain_bind(exc, config.host, config.http.port, "--http-port") from exc
    except OSError as exc:
        if exc.filename is not None:  # the log's directory, not the socket
            raise explain_db(sqlite3.OperationalError(exc.strerror), config.db) from exc
        raise explain_bind(exc, config.host, config.port) from exc


# init


def _init(args: argparse.Namespace) -> int:
    for line in write_starter(args.directory):
        print(line)
    print(
        f"next: bcpbus serve --config {args.directory / 'bcpbus.yaml'}, and "
        f"`bcpbus peers --peers-file {args.directory / 'bcpbus-peers.yaml'} add CLIENT_ID` for "
        "each peer",
        file=sys.stderr,
    )
    return 0


# peers


def _peers_add(args: argparse.Namespace) -> int:
    credentials = Credentials.load(args.peers_file)
    if args.client_id in credentials and not args.rotate:
        raise StartupError(
            f"{args.client_id} already has a token in {args.peers_file}: give --rotate to "
            f"replace it (`bcpbus peers rotate {args.client_id}`), or choose another clientId"
        )
    roles = list(args.role)
    if roles:
        policy = Policy.load(args.policy) if args.policy else Policy.default()
        policy.roles_for(args.client_id, roles)  # unknown role -> PolicyError
    elif args.client_id in credentials:
        record = credentials.record(args.client_id)
        roles = list(record.roles) if record is not None else []  # a rotation keeps the roles
    if args.subscribe and not args.webhook:
        raise ValueError("--subscribe is for webhook peers: give --webhook URL too")
    if args.webhook:
        validate_webhook_url(args.webhook)
        _check_webhook_address(args.webhook, args.allow_private_webhook)
    return _issue(args, credentials, roles)


def _check_webhook_address(url: str, allowed: bool) -> None:
    host = private_host(url)
    if host is not None and not allowed:
        raise StartupError(
            f"--webhook {url}: {host} is not a public address, and the bus calls only public "
            "ones unless its config sets http.allow_private_webhooks: true; give "
            "--allow-private-webhook to add it anyway"
        )


def _peers_rotate(args: argparse.Namespace) -> int:
    credentials = Credentials.load(args.peers_file)
    record = credentials.record(args.client_id)
    if record is None:
        raise StartupError(
            f"{args.client_id} has no token in {args.peers_file}: create one with "
            f"`bcpbus peers add {args.client_id}`"
        )
    return _issue(args, credentials, list(record.roles))


def _issue(args: argparse.Namespace, credentials: Credentials, roles: list[str]) -> int:
    rotated = args.client_id in credentials
    token = credentials.add(args.client_id, roles)
    secret = None
    webhook = getattr(args, "webhook", None)  # `peers rotate` keeps the webhook as it is
    if webhook:
        secret = credentials.set_webhook(args.client_id, webhook, args.subscribe)
    credentials.save(args.peers_file)
    print(token)
    if secret is not None:
        print(secret)
        print(
            f"the second line is the webhook secret: {webhook} checks X-Bcpbus-Signature "
            "with it (docs/http.md); restart the bus to reach the new webhook",
            file=sys.stderr,
        )
    what = "replaced the token of" if rotated else "stored the hash for"
    print(
        f"{what} {args.client_id} in {args.peers_file}; the token above is not kept anywhere, "
        "copy it now",
        file=sys.stderr,
    )
    return 0


def _peers_list(args: argparse.Namespace) -> int:
    if not args.peers_file.exists():
        raise StartupError(
            f"--peers-file {args.peers_file} does not exist: add a peer with `bcpbus peers add "
            "CLIENT_ID`, or give the file `bcpbus serve` reads"
        )
    records = Credentials.load(args.peers_file).records()
    if not records:
        print(f"bcpbus: {args.peers_file} has no peers", file=sys.stderr)
    for record in records:
        webhook = f"\t{record.webhook.url}" if record.webhook is not None else ""
        print(f"{record.client_id}\t{','.join(record.roles) or '-'}{webhook}")
    return 0


def _peers_remove(args: argparse.Namespace) -> int:
    credentials = Credentials.load(args.peers_file)
    if not credentials.remove(args.client_id):
        # The same error, and so the same exit code, as `peers rotate` of an unknown id.
        raise StartupError(
            f"{args.client_id} has no token in {args.peers_file}: nothing to remove; "
            "`bcpbus peers list` shows the clientIds that have one"
        )
    credentials.save(args.peers_file)
    print(f"removed {args.client_id} from {args.peers_file}", file=sys.stderr)
    return 0


# audit


def _dbs(args: argparse.Namespace) -> list[Path]:
    """The ``--db`` files given (several for a cluster's nodes), each checked to be a file."""
    value = getattr(args, "db", None) or [Path("bcpbus.db")]
    dbs: list[Path] = value if isinstance(value, list) else [value]
    for db in dbs:
        _check_db(db)
    return dbs


def _audit(args: argparse.Namespace) -> int:
    # Checked here rather than by argparse, so that a mistake is one line, not the usage text.
    if not 0 <= args.limit <= audit.MAX_LIMIT:
        raise ValueError(f"--limit {args.limit}: give a number of rows from 0 to {audit.MAX_LIMIT}")
    dbs = _dbs(args)
    out = "json" if args.json else args.format
    if len(dbs) > 1:
        if args.follow or args.bits or args.refusals or args.query:
            raise ValueError("several --db merge rows: give filters, not --follow, --bits, ...")
        print(_render(merged.merged_rows(dbs, **_filters(args), limit=args.limit), out))
        return 0
    args.db = dbs[0]
    if args.follow:
        return _follow(args, out)
    rows: list[dict[str, Any]]
    if args.bits:
        rows = audit.bits_per_channel(args.db, topic=args.topic, since=args.since, until=args.until)
    elif args.refusals:
        rows = audit.refusals_per_reason(args.db)
    elif args.query:
        return _audit_query(args.db, args.query, out)
    else:
        rows = audit.query_rows(args.db, **_filters(args), limit=args.limit)
    print(_render(rows, out))
    return 0


def _check_db(db: Path) -> None:
    if not db.is_file():
        what = "is a directory" if db.is_dir() else "does not exist"
        raise FileNotFoundError(
            f"--db {db} {what}: give the activity log's file (`bcpbus serve` writes "
            "./bcpbus.db unless told otherwise)"
        )


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    names = ("message_id", "topic", "actor", "since", "until", "event")
    return {name: getattr(args, name) for name in names}


def _render(rows: list[dict[str, Any]], out: str, *, header: bool = True) -> str:
    if out == "json":
        return audit.to_json(rows)
    if out == "jsonl":
        return audit.to_jsonl(rows)
    columns = [key for key in dict.fromkeys(k for row in rows for k in row) if key != "chain"]
    return audit.format_table(rows, columns, header=header)


FOLLOW_POLL = 0.25
"""Seconds between two reads of the log by ``audit --follow``."""


def _follow(args: argparse.Namespace, out: str) -> int:
    """Print the last ``--limit`` rows that pass the filters, then each new one, until killed."""
    if args.bits or args.refusals or args.query:
        raise ValueError("--follow follows rows: give filters, not --bits, --refusals or --query")
    if out == "json":
        raise ValueError("--follow prints a table or JSON lines: give --format jsonl")
    filters = _filters(args)
    through = audit.last_id(args.db)
    rows = audit.query_rows(args.db, **filters, limit=args.limit, newest=True, through_id=through)
    header = True
    while True:
        if rows:
            print(_render(rows, out, header=header), flush=True)
            header = False
        time.sleep(FOLLOW_POLL)
        after, through = through, audit.last_id(args.db)
        rows = audit.query_rows(args.db, **filters, limit=None, after_id=after, through_id=through)


def _audit_query(db: Path, query_id: str, out: str) -> int:
    detail = audit.query_detail(db, query_id)
    if out == "jsonl":
        print(audit.to_jsonl(detail["rows"]))
    elif out == "json":
        detail["rows"] = [json.loads(line) for line in audit.to_jsonl(detail["rows"]).splitlines()]
        print(json.dumps(detail, indent=2))
    else:
        print("\n".join(_query_lines(detail)))
        print()
        print(_render(detail["rows"], "table"))
    return 0


def _query_lines(detail: dict[str, Any]) -> list[str]:
    """The question, the reader's answers (untrusted, escaped) and the values delivered."""
    name = audit.neutralize(str(detail["query_id"]))
    if detail["accepted_ts"] is None:
        return [f"query {name}: no bcp_query_accepted row (refused, or not in this log)"]
    lines = [
        f"query {name} on {audit.neutralize(str(detail['channel']))}, category "
        f"{detail['category']}, accepted {detail['accepted_ts']}",
        "asked (the controller's spec):",
        *("  " + line for line in _json_lines(detail["spec"])),
    ]
    for number, answer in enumerate(detail["answers"], 1):
        lines.append(
            f"answer {number} from the reader, {answer['ts']}, validation {answer['status']} "
            "(untrusted: shown escaped, as sent):"
        )
        lines += ["  " + line for line in audit.untrusted_lines(answer["raw"])]
    for value in detail["delivered"]:
        lines.append(f"delivered to the controller {value['ts']} ({value['bits']} bits):")
        lines += ["  " + line for line in audit.untrusted_lines(value["response"])]
    if detail["failed"] is not None:
        failed = detail["failed"]
        lines.append(f"failed {failed['ts']}: {failed['reason']}: {failed['detail']}")
    lines.append(
        f"outcome: {detail['outcome'] or 'pending'}; charged {detail['charged']:.3f} bits, "
        f"refunded {detail['refunded']:.3f}"
    )
    return [audit.neutralize(line) for line in lines]


def _json_lines(value: Any) -> list[str]:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True).splitlines()


def _audit_verify(args: argparse.Namespace) -> int:
    dbs = _dbs(args)
    if len(dbs) == 1:
        return _verify_one(args, dbs[0])
    failed = 0
    for db in dbs:  # each node's chain on its own: a merge is only as good as every log in it
        print(f"{merged.node_name(db)} ({db}):")
        failed += _verify_one(args, db)
    return 1 if failed else 0


def _verify_one(args: argparse.Namespace, db: Path) -> int:
    key = args.key or (legacy if (legacy := default_key_path(db)).exists() else None)
    result = audit.verify(
        db,
        key,
        pubkey=args.pubkey,
        checkpoints=args.checkpoints,
        expect_head=args.expect_head,
        start=args.start,
    )
    for segment in result.segments[1:]:
        broken = segment.get("broken") or {}
        why = f": row {broken.get('row')}: {broken.get('why')}" if broken else ""
        print(f"note: row {segment['id']} ({segment['ts']}) starts a new chain segment{why}")
    if result.ok:
        row_id, chain = result.head or (0, "none")
        signed = ""
        if result.signed is not None:
            found = result.signed
            signed = f"; {found.signed} checkpoints verify, the last at row {found.last}"
        print(f"ok: {result.rows} rows intact; head {row_id}:{chain}{signed}")
    else:
        first, *more = result.problems
        where = f"row {first.row}" if first.row is not None else str(db)
        print(f"{where}: {audit.neutralize(first.why)}")
        if more:
            print(
                f"and {len(more)} more problems; the next: "
                + "; ".join(_problem(p) for p in more[:3])
            )
    for note in result.notes:  # after the verdict, which scripts read first
        print(f"note: {note}")
    return 0 if result.ok else 1


def _audit_keygen(args: argparse.Namespace) -> int:
    name = args.name or f"{socket.gethostname()}/bcpbus"
    public, key = create_signing_key(args.out, name)
    print(
        f"signing key: {args.out} (0600): give it to `bcpbus serve --signing-key`, and keep it "
        "where whoever can write the database cannot read it"
    )
    print(f"public key: {public}: {key.to_text()}")
    print(f"auditors check the log with: bcpbus audit verify --pubkey {public}")
    return 0


def _audit_pubkey(args: argparse.Namespace) -> int:
    # The .pub is the only file auditors need; it is derived, so a lost one costs nothing.
    print(load_signing_key(args.key).verifier.to_text())
    return 0


def default_signing_key_path() -> Path:
    """Where ``bcpbus serve`` keeps its signing key when none is given: the user's config
    directory (``$XDG_CONFIG_HOME/bcpbus``, else ``~/.config/bcpbus``), not the database's."""
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "bcpbus" / "signing.key"


def _checkpoints_line(config: ServeConfig) -> str:
    """What the start-up summary says of the log's checkpoints."""
    settings = config.audit
    if not settings.sign or settings.signing_key is None:
        return "off (nothing signs the activity log: give --signing-key)"
    target = settings.checkpoints or default_checkpoints_path(config.db)
    syslog = f" and to syslog {settings.syslog}" if settings.syslog else ""
    public = f"{settings.signing_key}.pub"
    # No .pub beside a key handed over on its own (a systemd credential, a copied file).
    how = (
        f"`bcpbus audit verify --pubkey {public}`"
        if os.path.exists(public)
        else f"its public key (`bcpbus audit pubkey {settings.signing_key}` prints it)"
    )
    return (
        f"signed with {settings.signing_key}, appended to {target}{syslog}; auditors check "
        f"them with {how}"
    )


def _default_signing_key(settings: AuditSettings) -> AuditSettings:
    """``settings`` with the default signing key filled in (and made, the first time) when
    checkpoints are on and no key was given; with them off if it cannot be made."""
    if not settings.sign or settings.signing_key is not None:
        return settings
    path = default_signing_key_path()
    try:
        if not path.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # another bcpbus made it meanwhile
                public, _ = create_signing_key(path, f"{socket.gethostname()}/bcpbus")
                logger.info("created the activity log's signing key %s (public: %s)", path, public)
    except OSError as exc:  # a read-only home: the bus still runs, and says what it lacks
        logger.warning(
            "activity log checkpoints are off: cannot make the signing key %s (%s); give "
            "--signing-key",
            path,
            exc,
        )
        return replace(settings, sign=False)
    return replace(settings, signing_key=str(path))


def _problem(problem: Any) -> str:
    where = f"row {problem.row}" if problem.row is not None else "the log"
    return f"{where}: {audit.neutralize(problem.why)}"


def _audit_head(args: argparse.Namespace) -> int:
    dbs = _dbs(args)
    for db in dbs:
        row_id, chain = audit.head(db)
        node = f"{merged.node_name(db)} " if len(dbs) > 1 else ""
        print(f"{node}{row_id}:{chain}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
