"""``python -m bench.mcp_transcript [--out FILE]``: record two MCP hosts using ``bcpbus mcp``.

A real run, written down: a bus and gateway for the reference agents (``peers.testing``), two
``bcpbus mcp`` subprocesses (``agent:main``, a controller; ``agent:researcher``, a reader), and
two MCP clients from the ``mcp`` SDK that act the way a model would: the controller host lists
its tools and channels and asks a Cat-2 question; the reader host takes the query, answers too
long, reads the reasons, and answers again. Every JSON-RPC message each client sends and
receives is recorded in order, as it crossed stdio, and written as JSON (docs/mcp.md shows it).

The only edit: each tool's ``inputSchema`` in a ``tools/list`` result is replaced by a note of
its size, to keep the file readable; run ``tools/list`` against the bridge for the schemas.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.message import SessionMessage

from peers.testing import BcpHarness, running_bcp

__all__ = ["main", "record"]

_AGENTS = Path(__file__).resolve().parents[1] / "agents"
_QUESTION = {
    "category": 2,
    "questions": [
        {
            "id": "vendor",
            "question": "Which company sells the product the page describes?",
            "max_words": 3,
            "expected_format": "short_text",
        }
    ],
}


class _Tape:
    """The frames one client sent (``host -> bridge``) and received (``bridge -> host``)."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def add(self, direction: str, item: object) -> None:
        if isinstance(item, SessionMessage):
            message = item.message.model_dump(by_alias=True, mode="json", exclude_none=True)
            self.frames.append({"direction": direction, "message": _elide(message)})


class _Recorded:
    """A stream that writes what passes through it on a :class:`_Tape`."""

    def __init__(self, stream: Any, tape: _Tape, direction: str) -> None:
        self._stream = stream
        self._tape = tape
        self._direction = direction

    async def receive(self) -> Any:
        item = await self._stream.receive()
        self._tape.add(self._direction, item)
        return item

    async def send(self, item: Any) -> None:
        self._tape.add(self._direction, item)
        await self._stream.send(item)

    async def aclose(self) -> None:
        await self._stream.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except Exception as exc:  # anyio's EndOfStream and ClosedResourceError end the loop
            raise StopAsyncIteration from exc

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def _recorded_stdio(params: StdioServerParameters, tape: _Tape) -> AsyncIterator[Any]:
    async with stdio_client(params) as (read, write):
        yield _Recorded(read, tape, "bridge -> host"), _Recorded(write, tape, "host -> bridge")


def _elide(message: dict[str, Any]) -> dict[str, Any]:
    tools = message.get("result", {}).get("tools")
    for tool in tools or ():
        size = len(json.dumps(tool.get("inputSchema", {})))
        tool["inputSchema"] = {"$comment": f"elided: {size} characters of JSON Schema"}
    return message


def _params(h: BcpHarness, client_id: str) -> StdioServerParameters:
    bcpbus = str(Path(sys.executable).with_name("bcpbus"))
    return StdioServerParameters(
        command=bcpbus,
        args=["mcp", "--url", h.bus.url, "--client-id", client_id, "--agents-dir", str(_AGENTS)],
        env={**os.environ, "BCPBUS_TOKEN": h.bus.token(client_id)},
    )


async def _call(client: Client, name: str, arguments: dict[str, Any]) -> types.CallToolResult:
    result = await client.call_tool(name, arguments)
    assert isinstance(result, types.CallToolResult)
    return result


async def _reader(client: Client) -> None:
    """The reader host: take the query, answer, and correct the answer the gateway rejects."""
    taken = await _call(client, "bcp_next_query", {"timeout_s": 30})
    query_id = (taken.structured_content or {})["query"]["query_id"]
    for answer in ("Acme Widgets Incorporated Worldwide", "Acme"):
        verdict = await _call(
            client, "bcp_answer", {"query_id": query_id, "response": {"vendor": answer}}
        )
        if not verdict.is_error:
            return


async def record() -> dict[str, list[dict[str, Any]]]:
    """Run both hosts once; return each one's frames."""
    controller_tape, reader_tape = _Tape(), _Tape()
    with tempfile.TemporaryDirectory() as directory:
        async with running_bcp(directory) as h:
            main = _recorded_stdio(_params(h, "agent:main"), controller_tape)
            researcher = _recorded_stdio(_params(h, "agent:researcher"), reader_tape)
            async with (
                Client(main, mode="legacy") as controller,
                Client(researcher, mode="legacy") as reader,
            ):
                await controller.list_tools()
                await _call(controller, "bcp_channels", {})
                answering = asyncio.create_task(_reader(reader))
                await _call(controller, "bcp_ask", {"reader": "researcher", "spec": _QUESTION})
                await answering
    return {"controller": controller_tape.frames, "reader": reader_tape.frames}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_transcript", description=__doc__)
    parser.add_argument("--out", type=Path, help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    text = json.dumps(asyncio.run(record()), indent=2, ensure_ascii=False) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
