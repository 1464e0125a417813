"""The echo agent: the reference agent that ``bcpbus system`` starts in the bootstrap flow.

``agents/echo.md`` declares ``command: [python, -m, peers.examples.echo]``; the system peer runs
that with the agent's identity in the environment, and this module reads it from there:

- ``BCPBUS_URL``: the bus; ``BCPBUS_CLIENT_ID``: ``agent:echo``; ``BCPBUS_TOKEN``: its token.

It answers each ``tg_message`` with a ``tg_reply`` that repeats the text, numbered (``echo 3:
hello``), to the chat's ``talkto``. A message it has answered before (the same ``id`` from the
same chat: the chat retried it) gets the same reply again and is not counted twice, so the
numbers show each message handled exactly once. It exits on SIGTERM, SIGINT, or when its standard
input closes: the system peer holds the other end, so the agent never outlives it.

A ``scheduled_message`` (one of its definition's ``cron_schedules`` came due) is answered
with a ``scheduled`` event naming the message and its time, once per time.

Each event is one JSON line on stdout (``ready``, ``configured``, ``answered``, ``repeated``,
``reply_failed``, ``scheduled``), which the system peer passes on to its own output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from schemas.chat import MAX_TEXT, Configure, ScheduledMessage, TgMessage, TgReply

from ..client import Message, Peer, Reply
from ..errors import PeerError
from ..tokens import TOKEN_ENV, find_token

__all__ = ["EchoAgent", "main"]

Out = Callable[[dict[str, Any]], None]


def _print_json(event: dict[str, Any]) -> None:
    print(json.dumps(event, ensure_ascii=False), flush=True)


class EchoAgent:
    """Answers chat messages on ``peer`` (handlers are registered here; connect it after).

    Args:
        peer: the agent's connection, not yet connected.
        out: where each event goes (default: a JSON line on stdout).
        remember: how many answered messages are kept to recognize a retry.
    """

    def __init__(self, peer: Peer, *, out: Out = _print_json, remember: int = 10_000) -> None:
        self.peer = peer
        self.out = out
        self.remember = remember
        self.count = 0
        """Messages answered, retries not counted."""
        self.talkto: dict[str, str] = {}
        """Chat clientId -> where its replies go, from its ``configure``."""
        self._answered: OrderedDict[tuple[str, str], TgReply] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._scheduled: set[tuple[str, str]] = set()
        peer.handle("configure", self._configure)
        peer.handle("tg_message", self._message)
        peer.handle("scheduled_message", self._scheduled_message)

    async def _scheduled_message(self, message: Message) -> Reply:
        try:
            content = ScheduledMessage.model_validate(message.content)
        except ValidationError:
            return Reply(False, "invalid", "scheduled_message content is {message, schedule, at}")
        key = (content.schedule, content.at.isoformat())
        if key not in self._scheduled:  # a resend of the same time acts once
            self._scheduled.add(key)
            self.out({"event": "scheduled", "message": content.message, "at": key[1]})
        return Reply(True, "scheduled")

    async def _configure(self, message: Message) -> Reply:
        try:
            content = Configure.model_validate(message.content)
        except ValidationError:
            return Reply(False, "invalid", "configure content is {talkto: clientId}")
        if content.talkto != message.sender:
            return Reply(False, "refused", "talkto must be the chat that sends configure")
        self.talkto[message.sender] = content.talkto
        self.out({"event": "configured", "chat": message.sender})
        return Reply(True, "configured")

    async def _message(self, message: Message) -> Reply:
        try:
            content = TgMessage.model_validate(message.content)
        except ValidationError:
            return Reply(False, "invalid", "tg_message content is {text, id}")
        talkto = self.talkto.get(message.sender)
        if talkto is None:
            return Reply(False, "not_configured", "send configure {talkto} first")
        # No await between the lookup and the count: two copies of one message that arrive
        # together are still counted once.
        key = (message.sender, content.id) if content.id is not None else None
        reply = self._answered.get(key) if key is not None else None
        event: dict[str, Any] = {"chat": message.sender, "id": content.id}
        status = "repeated"
        if reply is None:
            status = "answered"
            self.count += 1
            text = f"echo {self.count}: {content.text}"[:MAX_TEXT]
            reply = TgReply(text=text, in_reply_to=content.id)
            if key is not None:
                self._remember(key, reply)
            event |= {"n": self.count, "text": content.text}
        self.out({"event": status, **event})
        self._later(self._send(talkto, reply, message.message_id))
        return Reply(True, status)

    def _remember(self, key: tuple[str, str], reply: TgReply) -> None:
        self._answered[key] = reply
        while len(self._answered) > self.remember:
            self._answered.popitem(last=False)

    async def _send(self, talkto: str, reply: TgReply, correlation_id: str) -> None:
        content = reply.model_dump(exclude_none=True)
        try:
            await self.peer.send(talkto, "tg_reply", content, correlation_id=correlation_id)
        except PeerError as exc:
            # The chat retries its message and gets this reply again: nothing is lost here.
            self.out({"event": "reply_failed", "chat": talkto, "error": str(exc)})

    def _later(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Wait (up to 5 s) for the replies being sent. Idempotent."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)


def _watch_stdin(stop: asyncio.Event) -> None:
    """Set ``stop`` when standard input ends (in a daemon thread: a blocked read cannot be
    interrupted, and a daemon thread does not keep the process alive)."""
    loop = asyncio.get_running_loop()

    def pump() -> None:
        with contextlib.suppress(OSError):  # no standard input at all: as good as its end
            while os.read(sys.stdin.fileno(), 65536):
                pass
        with contextlib.suppress(RuntimeError):  # the loop closed already
            loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=pump, name="echo-stdin", daemon=True).start()


async def _run(url: str, client_id: str, token: str) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    _watch_stdin(stop)
    peer = Peer(url, client_id, token)
    agent = EchoAgent(peer)
    try:
        await peer.connect()
    except PeerError as exc:
        print(f"echo: cannot connect to {url} as {client_id}: {exc}", file=sys.stderr)
        await peer.close()
        return 1
    agent.out({"event": "ready", "agent": client_id})
    await stop.wait()
    await agent.close()
    await peer.close()
    return 0


def main() -> int:
    """Run the echo agent from its environment; return the exit code."""
    url = os.environ.get("BCPBUS_URL")
    client_id = os.environ.get("BCPBUS_CLIENT_ID")
    token = find_token(None, None)
    if not url or not client_id or token is None:
        print(
            f"echo: set BCPBUS_URL, BCPBUS_CLIENT_ID and {TOKEN_ENV}; `bcpbus system` does "
            "when it starts this agent",
            file=sys.stderr,
        )
        return 2
    return asyncio.run(_run(url, client_id, token))


if __name__ == "__main__":
    sys.exit(main())
