"""A real HTTP server for the tests that plays a webhook peer: it checks every signature itself
(with hashlib and hmac, not the bus's code) and answers each POST as its script says."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bus.transports.http import listen


@dataclass
class Post:
    """One POST the receiver got."""

    body: bytes
    headers: dict[str, str]
    signed: bool
    """The signature matched the receiver's own HMAC of ``timestamp.body``."""
    fresh: bool
    """The timestamp was within five minutes of the receiver's clock."""

    @property
    def message(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class Receiver:
    """Answers POSTs in the order of ``script``; the last step repeats.

    Steps: ``"ok"`` (``processed: true``), ``"500"`` / ``"503"`` (that status), ``"hang"``
    (no answer until the receiver closes), ``"garbage"`` (200 with a body that is not JSON).
    """

    secret: str
    script: list[str] = field(default_factory=lambda: ["ok"])
    posts: list[Post] = field(default_factory=list)
    received: asyncio.Queue[Post] = field(default_factory=asyncio.Queue)
    _release: asyncio.Event = field(default_factory=asyncio.Event)
    _server: uvicorn.Server | None = None
    _socket: socket.socket | None = None

    @property
    def url(self) -> str:
        assert self._socket is not None
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}/hook"

    async def __aenter__(self) -> Receiver:
        app = Starlette(routes=[Route("/hook", self._hook, methods=["POST"])])
        config = uvicorn.Config(app, lifespan="off", log_config=None, access_log=False)
        config.load()
        self._server = uvicorn.Server(config)
        self._server.lifespan = config.lifespan_class(config)
        self._socket = listen("127.0.0.1", 0)  # TCP_NODELAY, as the bus's own
        await self._server.startup(sockets=[self._socket])
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._release.set()
        assert self._server is not None
        await self._server.shutdown(sockets=[self._socket] if self._socket else None)

    async def _hook(self, request: Request) -> Response:
        body = await request.body()
        stamp = request.headers.get("x-bcpbus-timestamp", "")
        expected = hmac.new(
            self.secret.encode(), stamp.encode() + b"." + body, hashlib.sha256
        ).hexdigest()
        given = request.headers.get("x-bcpbus-signature", "")
        post = Post(
            body=body,
            headers=dict(request.headers),
            signed=hmac.compare_digest(given, f"sha256={expected}"),
            fresh=stamp.isdigit() and abs(time.time() - int(stamp)) < 300,
        )
        self.posts.append(post)
        self.received.put_nowait(post)
        if not post.signed or not post.fresh:
            return Response(status_code=401)
        step = self.script[min(len(self.posts), len(self.script)) - 1]
        if step == "hang":
            await self._release.wait()
            return Response(status_code=504)
        if step.isdigit():
            return Response(status_code=int(step))
        if step == "garbage":
            return Response(b"<html>", media_type="text/html")
        message = post.message
        return JSONResponse({"jsonrpc": "2.0", "id": message["id"], "result": {"processed": True}})


@dataclass
class RawReceiver:
    """A webhook that writes its answer byte for byte, as a hostile one would: any status line,
    any reason phrase, any body, sent in ``chunk``-sized writes.

    ``answer(body)`` returns the raw response for a request body. The requests' bodies are kept
    in ``bodies``; ``sent`` counts the answer bytes the bus read off the socket.
    """

    answer: Callable[[bytes], bytes]
    chunk: int = 1 << 16
    pause: float = 0.0
    """Seconds between two writes: the pace of a slow answer, not a synchronization."""
    bodies: list[bytes] = field(default_factory=list)
    sent: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/hook"

    async def __aenter__(self) -> RawReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length)
            self.bodies.append(body)
            answer = self.answer(body)
            for start in range(0, len(answer), self.chunk):
                if reader.at_eof():
                    break  # the bus hung up
                writer.write(answer[start : start + self.chunk])
                await writer.drain()
                self.sent += min(self.chunk, len(answer) - start)
                if self.pause:
                    await asyncio.sleep(self.pause)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the bus hung up: what a cap or a timeout does
        finally:
            self._tasks.discard(task)
            writer.close()
