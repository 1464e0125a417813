"""The ``bcpbus approve`` command: the command-line face of :mod:`peers.approver`.

:mod:`peers.cli` adds it to the ``bcpbus`` parser with :func:`add_approve`. Like
:mod:`peers.cli`, this module reads the environment and prints to the terminal; what it shows of
approval requests goes through :func:`peers.approver.render_request`, which escapes everything a
hostile reader wrote.

::

    bcpbus approve list                          # pending approvals, from ./bcpbus.db
    bcpbus approve --config site/bcpbus.yaml list   # from the db serve --config uses
    bcpbus approve show appr-1                   # one, rendered
    bcpbus approve --as human:alice --token-file alice.token approve appr-1
    bcpbus approve --as human:alice reject appr-1 --reason "off topic"    # token: $BCPBUS_TOKEN
    bcpbus approve --as human:alice edit appr-1 --response-json '{"summary": "..."}'
    bcpbus approve --as human:alice watch        # interactive
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TextIO, TypeVar

from websockets.exceptions import WebSocketException

from bus.core.errors import BusError
from bus.log import audit
from bus.ops.config import ServeConfig
from peers.approver import (
    Approver,
    Decision,
    StoredApproval,
    decision_refusal,
    edited_response,
    neutralize,
    read_approval,
    read_approvals,
    render_request,
)
from peers.client import Peer, PeerClosed
from schemas.bcp import BcpApprovalRequest, DecisionRefusal
from schemas.common import APPROVAL_TOPIC

from .tokens import TOKEN_ENV, find_token

__all__ = ["add_approve"]

T = TypeVar("T")

DEFAULT_URL = "ws://127.0.0.1:8765"

# Exit codes of the approve command.
EXIT_OK = 0
EXIT_REFUSED = 1  # the gateway did not take the decision, or no such approval
EXIT_USAGE = 2  # bad arguments, no token, the bus cannot be reached or refused the credentials

_CONNECTION_ERRORS = (OSError, ConnectionError, BusError, TimeoutError, WebSocketException)


def add_approve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``bcpbus approve`` to the ``bcpbus`` parser's subparsers."""
    approve = sub.add_parser(
        "approve",
        help="list, show and decide the gateway's approval requests",
        description="Decide what the BCP gateway asks a human about. list and show read the "
        "gateway's database; approve, reject, edit and watch connect to the bus as an "
        f"approver (--as human:NAME, with --token-file, --token or ${TOKEN_ENV}).",
    )
    _common_options(approve, suppress=False)
    actions = approve.add_subparsers(title="actions", metavar="ACTION", required=True)

    lst = _action(actions, "list", "pending approvals (--all: every approval)", _approve_list)
    lst.add_argument("--all", action="store_true", help="every approval, decided ones too")
    lst.add_argument("--json", action="store_true", help="JSON instead of a table")

    show = _action(actions, "show", "one approval, rendered for a person", _approve_show)
    show.add_argument("approval_id", metavar="ID", help="the approval's id (see `list`)")
    show.add_argument("--json", action="store_true", help="the stored row as JSON")

    for name, text in (("approve", "deliver the response as it is"), ("reject", "refuse it")):
        decide = _action(actions, name, text, _approve_decide)
        decide.add_argument("approval_id", metavar="ID", help="the approval's id (see `list`)")
        decide.add_argument("--reason", help="why, for the audit trail")

    edit = _action(actions, "edit", "replace the response (validated again)", _approve_decide)
    edit.add_argument("approval_id", metavar="ID", help="the approval's id (see `list`)")
    edit.add_argument(
        "--response-json",
        required=True,
        metavar="JSON",
        help='the whole replacement response, e.g. \'{"summary": "..."}\'',
    )
    edit.add_argument("--reason", help="why, for the audit trail")

    watch = _action(actions, "watch", "decide requests as they arrive", _approve_watch)
    watch.add_argument("--yes", action="store_true", help="approve everything (for scripts)")


def _action(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    text: str,
    command: Callable[[argparse.Namespace], int],
) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, help=text, description=text)
    # The common options are accepted after the action too; SUPPRESS keeps the value given
    # before it (or the default) when they are not repeated there.
    _common_options(parser, suppress=True)
    parser.set_defaults(command=command, action=name)
    return parser


def _common_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--url", default=default(DEFAULT_URL), help=f"the bus ({DEFAULT_URL})")
    parser.add_argument(
        "--as", dest="client_id", metavar="human:NAME", default=default(None), help="approver"
    )
    token = parser.add_mutually_exclusive_group()
    token.add_argument(
        "--token-file",
        type=Path,
        default=default(None),
        metavar="FILE",
        help="a file holding the approver's token",
    )
    token.add_argument("--token", default=default(None), help=f"(or ${TOKEN_ENV})")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--db", type=Path, default=default(None), help="the gateway's database (./bcpbus.db)"
    )
    where.add_argument(
        "--config",
        type=Path,
        default=default(None),
        metavar="FILE",
        help="read the database's path from serve's config file (bcpbus init DIR writes "
        "DIR/bcpbus.yaml)",
    )


def _database(args: argparse.Namespace) -> Path:
    """The gateway's database: ``--db``, else the ``db`` of the ``--config`` file that
    ``serve --config`` reads (relative to the file, as serve takes it), else ``./bcpbus.db``.

    Raises:
        ConfigError: the config file cannot be read.
    """
    if args.db is not None:
        return Path(args.db)
    if args.config is not None:
        return ServeConfig.load(args.config).db
    return Path("bcpbus.db")


def _no_database(exc: FileNotFoundError) -> int:
    _error(
        f"{exc}; name the bus's with --db FILE, or --config FILE as serve was given it "
        "(the bcpbus init layout: --config DIR/bcpbus.yaml)"
    )
    return EXIT_USAGE


# approve list / show


def _approve_list(args: argparse.Namespace) -> int:
    try:
        approvals = read_approvals(_database(args), open_only=not args.all)
    except FileNotFoundError as exc:
        return _no_database(exc)
    if args.json:
        print(json.dumps([approval.to_dict() for approval in approvals], indent=1))
    elif not approvals:
        print("no approvals" if args.all else "no pending approvals")
    else:
        print(audit.format_table([_summary(approval) for approval in approvals]))
    return EXIT_OK


def _summary(approval: StoredApproval) -> dict[str, Any]:
    request = approval.request
    spec = request.get("spec")
    return {
        "approval_id": approval.approval_id,
        "status": approval.status,
        "kind": request.get("kind"),
        "channel": f"{request.get('controller')} <- {request.get('reader')}",
        "query": request.get("query_id") or request.get("subscription_id"),
        "category": spec.get("category") if isinstance(spec, dict) else None,
        "created": approval.created_ts,
        "expires": approval.expires_ts,
        "decided_by": approval.decided_by,
    }


def _approve_show(args: argparse.Namespace) -> int:
    db = _database(args)
    try:
        approval = read_approval(db, args.approval_id)
    except FileNotFoundError as exc:
        return _no_database(exc)
    if approval is None:
        _error(f"no approval {args.approval_id} in {db}")
        return EXIT_REFUSED
    if args.json:
        print(json.dumps(approval.to_dict(), indent=1))
        return EXIT_OK
    print(render_request(approval.request, width=_width()))
    status = approval.status
    if approval.status == "pending" and not approval.is_open():
        status = "pending, but past its expiry: the gateway counts it as rejected"
    print(f"status: {neutralize(status)}")
    if approval.decided_by is not None:
        decision = approval.decision or {}
        line = f"decided by {approval.decided_by} at {approval.decided_ts}"
        if decision.get("reason"):
            line += f", reason: {decision['reason']}"
        print(neutralize(line))
        if decision.get("edited_response") is not None:
            print("edited response: " + neutralize(json.dumps(decision["edited_response"])))
    return EXIT_OK


# approve approve / reject / edit


def _approve_decide(args: argparse.Namespace) -> int:
    edited = None
    if args.action == "edit":
        try:
            edited = json.loads(args.response_json)
        except ValueError as exc:
            _error(f"--response-json is not JSON: {exc}")
            return EXIT_USAGE
        if not isinstance(edited, dict):
            _error('--response-json must be a JSON object, e.g. {"summary": "..."}')
            return EXIT_USAGE
    peer = _peer(args, reconnect=False)
    if peer is None:
        return EXIT_USAGE
    decision: Decision = args.action
    db = _database(args)
    return asyncio.run(_decide(peer, args.approval_id, decision, edited, args.reason, db))


async def _decide(
    peer: Peer,
    approval_id: str,
    decision: Decision,
    edited: dict[str, Any] | None,
    reason: str | None,
    db: Path,
) -> int:
    message_id = f"decision-{os.urandom(8).hex()}"
    try:
        async with peer:
            taken = await Approver(peer).decide(
                approval_id, decision, edited_response=edited, reason=reason, message_id=message_id
            )
    except ValueError as exc:  # the decision is malformed: pydantic names the problem
        _error(f"invalid decision: {exc}")
        return EXIT_USAGE
    except _CONNECTION_ERRORS as exc:
        _error(_connection_error(peer.url, exc))
        return EXIT_USAGE
    done = {"approve": "approved", "reject": "rejected", "edit": "edited"}[decision]
    if taken:
        print(f"{done} {approval_id}: the gateway took the decision")
        return EXIT_OK
    why = decision_refusal(db, message_id)
    code, _, detail = (why or "").partition(": ")
    if code == DecisionRefusal.ALREADY_DECIDED and detail:
        # Someone decided first, or it expired: say so first, not as a generic refusal.
        _error(
            f"{detail}; the gateway did not take this decision ({code}); "
            f"see `bcpbus approve show {approval_id}`"
        )
        return EXIT_REFUSED
    why = why or "it is unknown, already decided or expired, or the edit failed validation"
    _error(
        f"the gateway did not take the decision on {approval_id}: {why}; "
        f"see `bcpbus approve show {approval_id}`"
    )
    return EXIT_REFUSED


# approve watch


def _approve_watch(args: argparse.Namespace) -> int:
    peer = _peer(args, reconnect=True)
    if peer is None:
        return EXIT_USAGE
    return asyncio.run(_Watch(peer, yes=args.yes).run())


class _Watch:
    """The interactive loop: show each request as it arrives, ask, send the decision."""

    def __init__(self, peer: Peer, *, yes: bool, out: TextIO = sys.stdout) -> None:
        self.approver = Approver(peer)
        self.yes = yes
        self.out = out
        self.stop = asyncio.Event()
        self.lines: _Lines | None = None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop.set)
        try:
            await self.approver.start()
        except _CONNECTION_ERRORS as exc:
            await self.approver.close()
            _error(_connection_error(self.approver.peer.url, exc))
            return EXIT_USAGE
        try:
            self.say(f"watching {APPROVAL_TOPIC} as {self.approver.peer.client_id}; ", end="")
            self.say("approving everything" if self.yes else "Ctrl-C or end of input to stop")
            await self._loop()
        finally:
            await self.approver.close()
        return EXIT_OK

    async def _loop(self) -> None:
        if not self.yes:
            self.lines = _Lines()
        while True:
            request = await self._next_request()
            if request is None:
                return
            self.say(render_request(request, width=_width()))
            if not await self._decide(request):
                return

    async def _next_request(self) -> BcpApprovalRequest | None:
        """Wait for a request; None on a signal or at end of input."""
        while True:
            if self.lines is None:
                first = await self._race(self.approver.next_request())
            else:
                first = await self._race(self.approver.next_request(), self.lines.readline())
            match first:
                case (0, request):
                    return request  # type: ignore[no-any-return]
                case (1, str()):
                    # Input with no request on screen must not answer the next one.
                    self.say("no request is waiting; input ignored")
                case _:
                    return None

    async def _decide(self, request: BcpApprovalRequest) -> bool:
        """Decide one request; return False when the user ended the session."""
        approval_id = request.approval_id
        if self.yes:
            await self._send(approval_id, "approve")
            return True
        while True:
            answer = await self.ask("decide: [a]pprove / [r]eject / [e]dit / [s]kip")
            if answer is None:
                return False
            if approval_id not in self.approver.pending:
                self.say(f"{approval_id} is no longer pending: decided by someone else or expired")
                return True
            choice = answer.strip().lower()[:1]
            if choice == "a":
                await self._send(approval_id, "approve")
            elif choice == "r":
                reason = await self.ask("reason (optional, Enter for none)")
                if reason is None:
                    return False
                await self._send(approval_id, "reject", reason=reason.strip() or None)
            elif choice == "e":
                edited = await self._edited(request)
                if edited is None:
                    continue
                await self._send(approval_id, "edit", edited=edited)
            elif choice == "s":
                self.say(f"skipped {approval_id}: it stays pending")
            else:
                self.say("please answer a, r, e or s")
                continue
            return True

    async def _edited(self, request: BcpApprovalRequest) -> dict[str, Any] | None:
        hint = " (or plain text for the summary)" if request.spec.category == 3 else ""
        text = await self.ask(f"edited response as a JSON object{hint}")
        if text is None or not text.strip():
            return None
        try:
            return edited_response(text, request.spec.category)
        except ValueError:
            self.say('not a JSON object, e.g. {"q1": "answer"}')
            return None

    async def _send(
        self,
        approval_id: str,
        decision: Decision,
        *,
        edited: dict[str, Any] | None = None,
        reason: str | None = None,
    ) -> None:
        try:
            taken = await self.approver.decide(
                approval_id, decision, edited_response=edited, reason=reason
            )
        except (ValueError, BusError, PeerClosed, TimeoutError) as exc:
            self.say(f"could not send the decision on {approval_id}: {exc}")
            return
        done = {"approve": "approved", "reject": "rejected", "edit": "edited"}[decision]
        if taken:
            self.say(f"{done} {approval_id}: the gateway took the decision")
        else:
            self.say(
                f"the gateway did not take the decision on {approval_id}: already decided, "
                "expired, or the edit failed validation"
            )

    async def ask(self, prompt: str) -> str | None:
        """Print ``prompt``, return the next line of input; None at end of input or on stop."""
        assert self.lines is not None
        self.say(prompt)
        self.say("> ", end="")
        return await self._until(self.lines.readline())

    async def _until(self, aw: Coroutine[Any, Any, T]) -> T | None:
        """Await ``aw``; None if a signal stops the session first."""
        first = await self._race(aw)
        return None if first is None else first[1]

    async def _race(self, *aws: Coroutine[Any, Any, Any]) -> tuple[int, Any] | None:
        """Await the first of ``aws`` to finish and cancel the others; return its index and
        result, or None if a signal stops the session first. Earlier ones win ties."""
        tasks = [asyncio.ensure_future(aw) for aw in aws]
        stop = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({*tasks, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (*tasks, stop):
                task.cancel()
            await asyncio.gather(*tasks, stop, return_exceptions=True)
        for index, task in enumerate(tasks):
            if task.done() and not task.cancelled():
                return index, task.result()
        return None

    def say(self, text: str, *, end: str = "\n") -> None:
        print(text, end=end, file=self.out, flush=True)


class _Lines:
    """Lines of stdin for the event loop.

    A daemon thread does the blocking reads: a thread blocked in ``read()`` cannot be
    interrupted, and a daemon thread does not keep the process alive at exit. ``readline()``
    returns None at end of input.
    """

    def __init__(self, stream: TextIO = sys.stdin) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()
        self._stream = stream
        threading.Thread(target=self._pump, name="bcpbus-stdin", daemon=True).start()

    def _pump(self) -> None:
        try:
            for line in self._stream:
                self._put(line)
        finally:
            self._put(None)

    def _put(self, line: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is reading any more
            self._loop.call_soon_threadsafe(self._queue.put_nowait, line)

    async def readline(self) -> str | None:
        line = await self._queue.get()
        if line is None:
            self._queue.put_nowait(None)  # stay at end of input
        return line


# Shared


def _peer(args: argparse.Namespace, *, reconnect: bool) -> Peer | None:
    """The approver's connection from the options; None (after saying why) if one is missing."""
    client_id = args.client_id
    if not client_id:
        _error(f"approve {args.action}: --as human:NAME is required")
        return None
    if ":" not in client_id:
        client_id = f"human:{client_id}"
    token = find_token(args.token, args.token_file)
    if token is None:
        _error(f"approve {args.action}: give --token-file FILE, --token TOKEN or ${TOKEN_ENV}")
        return None
    return Peer(args.url, client_id, token, reconnect=reconnect)


def _width() -> int:
    return max(60, min(100, shutil.get_terminal_size().columns))


def _connection_error(url: str, exc: Exception) -> str:
    if isinstance(exc, BusError):
        return f"the bus at {url} refused: {exc}"
    return f"cannot reach the bus at {url}: {exc or type(exc).__name__}"


def _error(text: str) -> None:
    print(f"bcpbus: error: {text}", file=sys.stderr)
