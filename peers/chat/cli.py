"""The ``bcpbus chat`` command: a terminal chat, one line per message, on :class:`Chat`.

::

    bcpbus chat tg:42 --agent echo --token-file tg42.token     # type lines; replies print
    printf 'hi\\n' | bcpbus chat tg:42 --agent echo --json     # JSON events; exits when answered

It reads lines from standard input, sends each as a ``tg_message`` and prints the replies
(``agent:echo> ...``; a reader's text the gateway forwarded comes after a line with its notice and
provenance, each line behind ``| ``; ``--json``: every event as one JSON line on stdout). At the
end of input it exits once every line is answered; SIGINT or SIGTERM stop it at once, and what
was not answered is sent when it is started again with the same ``--db``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sqlite3
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any

from bus.ops.credentials import validate_client_id
from schemas.chat import MAX_TEXT

from ..approver import neutralize
from ..client import ConnectionEvent, GaveUp, Peer
from ..errors import PeerError, RequestRefused
from ..tokens import TOKEN_ENV, find_token
from ..urls import UrlOption
from .chat import Chat, Out, RetrySettings, SpawnFailed
from .store import ChatStore

__all__ = ["UNTRUSTED_BAR", "add_chat"]

DEFAULT_URL = "ws://127.0.0.1:8765"

UNTRUSTED_BAR = "| "
"""What starts each line of an untrusted text (a reader's, forwarded by the gateway) in plain
output, after a line with the notice: the text is data, not the agent's words."""

_SHOWN = {
    "resumed",
    "route_assigned",
    "spawn_result",
    "spawn_not_taken",
    "send_failed",
    "not_delivered",
}
"""The events plain output shows (on stderr) besides the replies."""


def add_chat(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bcpbus chat`` to the ``bcpbus`` parser's subparsers."""
    parser = sub.add_parser(
        "chat",
        help="a terminal chat: ask the system peer for an agent, then talk to it",
        description="Talk to an agent from the terminal as the chat CHAT (tg:NAME): ask "
        "agent:system to spawn --agent, configure it, send each line of input as a tg_message "
        "and print the replies. Route, retry queue and history live in --db, so a restarted "
        "chat resumes where it stopped.",
    )
    parser.add_argument("chat", metavar="CHAT", help="this chat's clientId, tg:NAME (or NAME)")
    parser.add_argument("--agent", metavar="NAME", help="the agent definition to ask for")
    parser.add_argument(
        "--url",
        action=UrlOption,
        default=DEFAULT_URL,
        help=f"the bus (default {DEFAULT_URL}); repeat it, or give a comma list, to fail over",
    )
    parser.add_argument("--token", help=f"the chat's token (or ${TOKEN_ENV})")
    parser.add_argument("--token-file", type=Path, metavar="FILE", help="a file with the token")
    parser.add_argument(
        "--db", type=Path, default=Path("bcpbus-chat.db"), help="the chat's SQLite file"
    )
    parser.add_argument("--json", action="store_true", help="every event as a JSON line")
    defaults = RetrySettings()
    parser.add_argument(
        "--retry-initial",
        type=float,
        default=defaults.initial,
        metavar="SECONDS",
        help=f"first retry delay, doubled each time (default {defaults.initial:g})",
    )
    parser.add_argument(
        "--retry-max",
        type=float,
        default=defaults.maximum,
        metavar="SECONDS",
        help=f"longest retry delay (default {defaults.maximum:g})",
    )
    parser.add_argument(
        "--reply-timeout",
        type=float,
        default=defaults.reply_timeout,
        metavar="SECONDS",
        help="send a taken message again after this long without a reply "
        f"(default {defaults.reply_timeout:g})",
    )
    parser.set_defaults(command=_chat)


def _chat(args: argparse.Namespace) -> int:
    chat_id = validate_client_id(args.chat if ":" in args.chat else f"tg:{args.chat}")
    token = find_token(args.token, args.token_file)
    if token is None:
        raise ValueError(f"chat: give --token-file FILE, --token TOKEN or ${TOKEN_ENV}")
    if min(args.retry_initial, args.retry_max, args.reply_timeout) <= 0:
        raise ValueError("chat: --retry-initial, --retry-max and --reply-timeout must be > 0")
    settings = RetrySettings(args.retry_initial, args.retry_max, args.reply_timeout)
    store = ChatStore.open(args.db, chat_id)
    try:
        route = store.route()
        agent = args.agent or (route.agent.removeprefix("agent:") if route else None)
        if agent is None:
            raise ValueError("chat: give --agent NAME, the agent to ask the system peer for")
        out = _json_line if args.json else _plain
        return asyncio.run(_run(Peer(args.url, chat_id, token), store, agent, out, settings))
    finally:
        store.close()


async def _run(peer: Peer, store: ChatStore, agent: str, out: Out, settings: RetrySettings) -> int:
    chat = Chat(peer, store, agent, out=out, settings=settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    peer.on_connection = partial(_stop_on_refusal, stop)
    try:
        await peer.connect()
    except PeerError as exc:
        # ConnectFailed says "cannot connect to URL: ..."; a refusal needs the who and where.
        refused = f"the bus at {peer.url} refused {peer.client_id}: {exc}"
        out({"event": "error", "message": refused if isinstance(exc, RequestRefused) else str(exc)})
        await peer.close()
        return 1
    _read_lines(chat, out)
    runner = asyncio.create_task(chat.run())
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (runner, stopper):
            task.cancel()
        outcomes = await asyncio.gather(runner, stopper, return_exceptions=True)
        await peer.close()
    failure = outcomes[0]
    if peer.gave_up is not None:
        out({"event": "error", "message": _revoked(peer)})
        return 2
    if isinstance(failure, SpawnFailed):
        out({"event": "error", "message": f"{failure}; the lines typed stay queued in the --db"})
        return 1
    if isinstance(failure, sqlite3.Error):
        out({"event": "error", "message": f"the chat's file failed: {failure}"})
        return 1
    if isinstance(failure, Exception):
        raise failure  # a bug: its traceback is the report
    return 0


def _revoked(peer: Peer) -> str:
    who = peer.client_id
    return (
        f"the bus at {peer.url} no longer accepts {who}'s token: it was revoked or rotated; get "
        f"a new one (`bcpbus peers add {who}`, or `bcpbus peers rotate {who}` where it still "
        "has one); the lines typed stay queued in the --db"
    )


def _stop_on_refusal(stop: asyncio.Event, event: ConnectionEvent) -> None:
    # The SDK reconnects after a restart; once the bus refuses the token (revoked, rotated) it
    # gives up, and a chat left waiting would retry into nothing, saying nothing.
    if isinstance(event, GaveUp):
        stop.set()


def _read_lines(chat: Chat, out: Out) -> None:
    """Feed standard input to ``chat`` line by line, from a daemon thread (a blocked read cannot
    be interrupted; a daemon thread does not keep the process alive)."""
    loop = asyncio.get_running_loop()

    def line(text: str) -> None:
        text = text.rstrip("\r\n")
        if len(text) > MAX_TEXT:
            out({"event": "error", "message": f"line over {MAX_TEXT} characters not sent"})
        elif text.strip():
            try:
                chat.say(text)
            except sqlite3.Error as exc:  # disk full, file gone: say so, it was not queued
                out({"event": "error", "message": f"line not saved, so not sent: {exc}"})

    def pump() -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
            for text in sys.stdin:
                loop.call_soon_threadsafe(line, text)
            loop.call_soon_threadsafe(chat.end_of_input)

    threading.Thread(target=pump, name="bcpbus-chat-stdin", daemon=True).start()


def _json_line(event: dict[str, Any]) -> None:
    print(json.dumps(event, ensure_ascii=False), flush=True)


def _plain(event: dict[str, Any]) -> None:
    # What the agent writes reaches a terminal: every control character is shown escaped, so a
    # reply can neither move the cursor nor pass itself off as this program's output.
    kind = event["event"]
    if kind == "reply":
        prefix = f"{event['from']}> "
        if event.get("untrusted"):
            print(neutralize(prefix + _marking(event)), flush=True)
            prefix += UNTRUSTED_BAR  # on every line: no line of the text can pass for another's
        for text in str(event["text"]).splitlines() or [""]:
            print(f"{prefix}{neutralize(text)}", flush=True)
    elif kind == "error":
        print(neutralize(f"bcpbus: error: {event['message']}"), file=sys.stderr, flush=True)
    elif kind in _SHOWN:
        details = " ".join(f"{key}={value}" for key, value in event.items() if key != "event")
        print(neutralize(f"bcpbus chat: {kind} {details}"), file=sys.stderr, flush=True)


def _marking(event: dict[str, Any]) -> str:
    """The line above an untrusted text: the notice and where the text came from."""
    provenance = event.get("provenance") or {}
    source = ", ".join(f"{key} {value}" for key, value in sorted(provenance.items()))
    return f"[untrusted{': ' + source if source else ''}] {event.get('notice', '')}".rstrip()
