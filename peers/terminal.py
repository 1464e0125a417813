"""Terminal tools in the style of the NATS CLI: ``bcpbus pub``, ``sub``, ``req`` and
``bcpbus peers online``.

Each connects as a peer like any other (``--as CLIENT_ID`` with a token from ``--token``,
``--token-file`` or ``$BCPBUS_TOKEN``), so the policy decides what it may send and read::

    bcpbus pub agent:w1 tg_message '{"text": "hello"}' --as tg:42
    bcpbus sub 'tg:42' --as tg:42 --count 1            # one JSON line per delivery
    bcpbus req agent:w1 tg_message '{"text": "hi"}' --as tg:42 --timeout 5
    bcpbus peers online --as operator:alice            # who is connected (admin roles only)

**What a reply is on this bus**: a message to the requester's own clientId (to which every peer
the policy allows is subscribed from the start) whose envelope ``correlationId`` is the
request's ``messageId``. ``req`` sends, then prints the first such message and exits 0; any
other delivery meanwhile is answered and ignored. Nothing waits on the bus's side: a request
nobody answers ends with exit code 1 after ``--timeout`` seconds.

Every failure is one line on stderr that says what to do, with exit code 1 (no reply, the bus
refused the message) or 2 (bad arguments, no token, the bus unreachable or refusing the
credentials).

``sub`` outlives the bus: when the connection drops (a restart) it says so on stderr,
reconnects with backoff, says so again, and first prints what was sent meanwhile (fetched by
epoch), so a restart loses nothing. When the bus then refuses its token (revoked or rotated: the
connection closes with 4005) it exits 2 with one line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

from bus.core.errors import BusError
from bus.core.topics import matches, validate_pattern, validate_topic
from bus.log import audit
from schemas.bus import ListPeersResult, SendMessageResult

from .client import ConnectionEvent, Disconnected, GaveUp, Message, Peer, Reconnected, Reply
from .errors import AuthenticationFailed, InvalidParams, PeerClosed, PeerError, RequestRefused
from .tokens import TOKEN_ENV, find_token
from .urls import UrlOption

__all__ = ["CLIENT_ENV", "DEFAULT_URL", "URL_ENV", "add_online", "add_terminal"]

DEFAULT_URL = "ws://127.0.0.1:8765"

CLIENT_ENV = "BCPBUS_CLIENT_ID"
"""The environment variable read when ``--as`` is not given."""

URL_ENV = "BCPBUS_URL"
"""The environment variable read when ``--url`` is not given."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class ToolError(Exception):
    """A terminal tool cannot go on; the message is the one line it prints."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def add_terminal(sub: Any) -> None:
    """Add ``bcpbus pub``, ``sub`` and ``req`` to the ``bcpbus`` parser's subparsers."""
    pub = sub.add_parser(
        "pub",
        help="send one message to a topic",
        description="Send one message and print the bus's answer (accepted, messageId, "
        "deliveredTo) as JSON.",
    )
    _message_arguments(pub)
    pub.set_defaults(command=_tool(_pub, _check_message))

    sub_ = sub.add_parser(
        "sub",
        help="print the messages on a topic pattern as JSON lines",
        description="Subscribe to PATTERN and print each delivery as one JSON line "
        '({"topic", "payload"}) as it arrives, until --count or Ctrl-C.',
    )
    sub_.add_argument("pattern", metavar="PATTERN", help="a topic pattern, e.g. 'agent:*'")
    sub_.add_argument(
        "--count", type=int, metavar="N", help="exit 0 after N messages (default: run until Ctrl-C)"
    )
    _connection_options(sub_)
    sub_.set_defaults(command=_tool(_sub, _check_sub, stays=True))

    req = sub.add_parser(
        "req",
        help="send a message and wait for its reply",
        description="Send one message, then print the first message to --as whose "
        "correlationId is the sent messageId (the reply) as a JSON line. Exit 1 if none "
        "comes within --timeout.",
    )
    _message_arguments(req)
    req.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the reply (default 10)"
    )
    req.set_defaults(command=_tool(_req, _check_req))


def add_online(peers_actions: Any) -> None:
    """Add ``online`` to the actions of ``bcpbus peers``."""
    online = peers_actions.add_parser(
        "online",
        help="who is connected now: roles, since when, requests and deliveries in flight",
        description="Ask the bus (listPeers) for its connected peers. Only a clientId whose "
        "roles have `admin: true` in the policy may ask: operator:NAME in the default policy.",
    )
    online.add_argument("--json", action="store_true", help="JSON instead of a table")
    _connection_options(online)
    online.set_defaults(command=_tool(_online))


def _message_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topic", metavar="TOPIC", help="where to send it, e.g. agent:w1")
    parser.add_argument("type", metavar="TYPE", help="the message type, e.g. tg_message")
    parser.add_argument(
        "content", metavar="JSON", help='the content, a JSON object, e.g. \'{"text": "hi"}\''
    )
    parser.add_argument("--correlation-id", help="the envelope's correlationId (a reply's)")
    _connection_options(parser)


def _connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        action=UrlOption,
        default=os.environ.get(URL_ENV, DEFAULT_URL),
        help=f"the bus, ws:// or wss:// (or ${URL_ENV}; default {DEFAULT_URL}); repeat it, or "
        "give a comma list, to fail over between several",
    )
    parser.add_argument(
        "--as",
        dest="client_id",
        metavar="CLIENT_ID",
        default=os.environ.get(CLIENT_ENV),
        help=f"the clientId to connect as (or ${CLIENT_ENV})",
    )
    parser.add_argument("--token", help=f"its token (or --token-file, or ${TOKEN_ENV})")
    parser.add_argument("--token-file", type=Path, help="a file holding the token")
    parser.add_argument(
        "--cafile", type=Path, help="for wss://, trust the CA certificates in this PEM file"
    )


# Running a tool


Tool = Callable[[argparse.Namespace, Peer], Coroutine[Any, Any, int]]


def _tool(
    tool: Tool, check: Callable[[argparse.Namespace], None] | None = None, *, stays: bool = False
) -> Callable[[argparse.Namespace], int]:
    """The command that checks the arguments, connects, runs ``tool``, and turns every failure
    into one line. A tool that ``stays`` connected reconnects when the connection drops."""

    def command(args: argparse.Namespace) -> int:
        try:
            if check is not None:
                check(args)
            return asyncio.run(_connected(args, tool, stays))
        except ToolError as exc:
            print(f"bcpbus: error: {exc}", file=sys.stderr)
            return exc.code

    return command


async def _connected(args: argparse.Namespace, tool: Tool, stays: bool) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with _peer(args, reconnect=stays) as peer:
        work = asyncio.ensure_future(tool(args, peer))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait([work, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            return EXIT_OK  # interrupted: what came was printed
        return work.result()


@contextlib.asynccontextmanager
async def _peer(args: argparse.Namespace, *, reconnect: bool = False) -> AsyncIterator[Peer]:
    client_id = args.client_id
    if not client_id:
        raise ToolError(f"no clientId: give --as CLIENT_ID (or set ${CLIENT_ENV})")
    try:
        token = find_token(args.token, args.token_file)
    except OSError as exc:
        raise ToolError(f"--token-file {args.token_file}: cannot read it: {exc.strerror}") from exc
    if token is None:
        raise ToolError(
            f"no token for {client_id}: give --token-file FILE, --token, or set ${TOKEN_ENV} "
            f"(`bcpbus peers add {client_id}` makes one)"
        )
    try:
        peer = Peer(
            args.url,
            client_id,
            token,
            reconnect=reconnect,
            cafile=args.cafile,
        )
        # Told the peer itself, so that each line names the bus it is about (of several).
        peer.on_connection = partial(_say_connection, peer)
        await peer.connect()
    except AuthenticationFailed as exc:
        # The bus does not say whether the clientId or the token was wrong (that would tell
        # an attacker which clientIds exist), so the hint covers both without guessing.
        raise ToolError(
            f"the bus at {args.url} refused {client_id}'s token: check --as and the token; "
            f"a clientId the bus does not know needs `bcpbus peers add {client_id}` on the "
            "bus's host (`bcpbus peers list` shows the ones it knows)"
        ) from exc
    except (PeerError, OSError) as exc:
        raise ToolError(
            f"--url {args.url}: {exc}: is `bcpbus serve` running there? (--cafile for a private CA)"
        ) from exc
    try:
        yield peer
    finally:
        await peer.close()


def _say_connection(peer: Peer, event: ConnectionEvent) -> None:
    """Tell the user on stderr that the connection to ``peer``'s bus dropped or came back."""
    url = peer.url
    match event:
        case Disconnected(closed=closed, reconnecting=True):
            why = f"close code {closed.code}" if closed.code is not None else "no close frame"
            reason = f": {closed.reason}" if closed.reason else ""
            _stderr(f"bcpbus: connection to {url} lost ({why}{reason}); reconnecting")
        case Reconnected(last_epoch=epoch):
            after = f"; catching up after epoch {epoch}" if epoch is not None else ""
            _stderr(f"bcpbus: reconnected to {url}{after}")
        case _:
            pass  # giving up ends the tool, which says why


def _revoked(url: str, client_id: str, closed: PeerClosed | None) -> ToolError:
    """The one line for a token the bus no longer takes."""
    how = f" (close code {closed.code}: {closed.reason})" if closed and closed.code else ""
    return ToolError(
        f"the bus at {url} no longer accepts {client_id}'s token{how}: it was revoked or "
        f"rotated; get a new one (`bcpbus peers add {client_id}`, or `bcpbus peers rotate "
        f"{client_id}` where it still has one) and start again"
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _check_message(args: argparse.Namespace) -> None:
    _content(args.content)
    try:
        validate_topic(args.topic)
    except BusError as exc:  # the bus's own check, run here before connecting
        raise ToolError(f"TOPIC {args.topic!r}: {exc.message}") from exc


def _check_sub(args: argparse.Namespace) -> None:
    if args.count is not None and args.count < 1:
        raise ToolError(f"--count {args.count}: give a number of messages from 1 up")
    try:
        validate_pattern(args.pattern)
    except BusError as exc:  # the bus's own check, run here before connecting
        raise ToolError(f"PATTERN {args.pattern!r}: {exc.message}") from exc


def _check_req(args: argparse.Namespace) -> None:
    _check_message(args)
    if not args.timeout > 0:
        raise ToolError(f"--timeout {args.timeout:g}: give a number of seconds above 0")


def _content(text: str) -> dict[str, Any]:
    try:
        content = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolError(f"JSON {text[:60]!r} is not JSON ({exc.msg}): give an object") from exc
    if not isinstance(content, dict):
        raise ToolError(f"JSON {text[:60]!r} is not an object: give one, e.g. '{{}}'")
    return content


def _line(message: Message) -> str:
    return json.dumps({"topic": message.topic, "payload": message.payload}, ensure_ascii=False)


async def _send(
    args: argparse.Namespace, peer: Peer, message_id: str | None = None
) -> SendMessageResult:
    content = _content(args.content)
    try:
        return await peer.send(
            args.topic,
            args.type,
            content,
            correlation_id=args.correlation_id,
            message_id=message_id,
        )
    except RequestRefused as exc:
        # Forbidden shares -32602 with InvalidParams, so it arrives as the latter.
        hint = " (the policy decides who may send what: see docs/protocol.md)"
        text = f"{args.topic}: {exc}{hint if isinstance(exc, InvalidParams) else ''}"
        raise ToolError(text, EXIT_FAILED) from exc


# The tools


async def _pub(args: argparse.Namespace, peer: Peer) -> int:
    result = await _send(args, peer)
    print(json.dumps(result.model_dump(by_alias=True)), flush=True)
    return EXIT_OK


async def _sub(args: argparse.Namespace, peer: Peer) -> int:
    pattern = args.pattern
    queue: asyncio.Queue[Message | GaveUp] = asyncio.Queue()
    say = peer.on_connection
    dropped: list[PeerClosed] = []

    async def deliver(message: Message) -> Reply:
        if matches(pattern, message.topic):
            queue.put_nowait(message)
        return Reply(True)

    def watch(event: ConnectionEvent) -> None:
        if say is not None:
            say(event)
        if isinstance(event, Disconnected):
            dropped.append(event.closed)
        elif isinstance(event, GaveUp):
            queue.put_nowait(event)

    peer.handle(None, deliver)
    peer.on_connection = watch
    try:
        await peer.subscribe(pattern)
    except RequestRefused as exc:
        raise ToolError(f"PATTERN {pattern!r}: {exc}") from exc
    print(f"bcpbus: subscribed to {pattern} as {peer.client_id}", file=sys.stderr, flush=True)
    seen = 0
    while args.count is None or seen < args.count:
        item = await queue.get()
        if isinstance(item, GaveUp):
            raise _revoked(args.url, peer.client_id, dropped[-1] if dropped else None)
        print(_line(item), flush=True)
        seen += 1
    return EXIT_OK


async def _req(args: argparse.Namespace, peer: Peer) -> int:
    message_id = uuid.uuid4().hex
    reply: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    async def deliver(message: Message) -> Reply:
        if message.payload.get("correlationId") == message_id and not reply.done():
            reply.set_result(message)
        return Reply(True)

    peer.handle(None, deliver)
    topics = peer.server_info.capabilities.topics if peer.server_info is not None else []
    if not any(matches(pattern, peer.client_id) for pattern in topics):
        raise ToolError(
            f"{peer.client_id} may not subscribe to its own clientId under the policy, so no "
            "reply could reach it: connect --as a clientId that may"
        )
    await _send(args, peer, message_id)
    try:
        async with asyncio.timeout(args.timeout):
            message = await reply
    except TimeoutError:
        raise ToolError(
            f"no reply to {message_id} within {args.timeout:g} s: a reply is a message to "
            f"{peer.client_id} with correlationId {message_id}",
            EXIT_FAILED,
        ) from None
    print(_line(message), flush=True)
    return EXIT_OK


async def _online(args: argparse.Namespace, peer: Peer) -> int:
    try:
        result = ListPeersResult.model_validate(await peer.request("listPeers"))
    except RequestRefused as exc:
        raise ToolError(f"{peer.client_id}: {exc}", EXIT_FAILED) from exc
    rows = [
        {
            "client_id": p.client_id,
            "roles": ",".join(p.roles) or "-",
            "taint": p.taint,
            "since": p.since.isoformat(timespec="seconds"),
            "address": p.address,
            "inflight": f"{p.inflight.requests} req / {p.inflight.deliveries} dlv",
            "subscriptions": " ".join(p.subscriptions),
        }
        for p in result.peers
    ]
    if args.json:
        print(result.model_dump_json(by_alias=True, indent=1))
    else:
        print(audit.format_table(rows))
    return EXIT_OK
