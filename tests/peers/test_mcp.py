"""`bcpbus mcp` as MCP hosts see it: the bridge in a subprocess, driven over stdio by the mcp
SDK's own client, against a real bus and gateway."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

mcp = pytest.importorskip("mcp")  # the mcp extra; installed with dev

import mcp_types as types  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.shared.exceptions import MCPDeprecationWarning  # noqa: E402

from peers.mcp.server import INBOX_URI  # noqa: E402
from peers.mcp.tools import BUS_TOOLS, CONTROLLER_TOOLS, READER_TOOLS  # noqa: E402
from peers.testing import BcpHarness, running_bcp, scaled  # noqa: E402
from schemas.bcp import UNTRUSTED_NOTICE  # noqa: E402

BCPBUS = str(Path(sys.executable).with_name("bcpbus"))
AGENTS = Path(__file__).resolve().parents[2] / "agents"

CAT1 = {
    "category": 1,
    "fields": [
        {"name": "has_pricing", "type": "boolean"},
        {"name": "tier", "type": "enum", "values": ["free", "pro", "enterprise"]},
    ],
}
CAT2 = {
    "category": 2,
    "questions": [
        {
            "id": "company",
            "question": "Who makes it?",
            "max_words": 3,
            "expected_format": "short_text",
        }
    ],
}


class Host:
    """One MCP host: the client session, and the inbox notifications it received."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.updates: asyncio.Queue[str] = asyncio.Queue()

    async def call(
        self, name: str, arguments: dict[str, Any] | None = None
    ) -> types.CallToolResult:
        result = await self.client.call_tool(name, arguments or {})
        assert isinstance(result, types.CallToolResult)
        return result

    async def inbox(self) -> dict[str, Any]:
        result = await self.client.read_resource(INBOX_URI)
        content = result.contents[0]
        assert isinstance(content, types.TextResourceContents)
        return dict(json.loads(content.text))

    async def updated(self, seconds: float = 10.0) -> str:
        async with asyncio.timeout(scaled(seconds)):
            return await self.updates.get()


@contextlib.asynccontextmanager
async def host(h: BcpHarness, client_id: str, *, mode: str = "auto") -> AsyncIterator[Host]:
    """Start ``bcpbus mcp`` for ``client_id`` and connect an MCP client to it over stdio."""
    env = {**os.environ, "BCPBUS_TOKEN": h.bus.token(client_id)}
    params = StdioServerParameters(
        command=BCPBUS,
        args=["mcp", "--url", h.bus.url, "--client-id", client_id, "--agents-dir", str(AGENTS)],
        env=env,
    )
    box: list[Host] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            box[0].updates.put_nowait(message.params.uri)

    async with Client(params, mode=mode, message_handler=on_message) as client:
        box.append(Host(client))
        if mode == "legacy":  # a host on the handshake protocol subscribes to the resource
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await client.subscribe_resource(INBOX_URI)
        yield box[0]


def names(tools: tuple[Any, ...]) -> set[str]:
    return {tool.name for tool in tools}


async def answer(reader: Host, response: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Take the next query on ``reader``'s host and answer it; return the query and verdict."""
    taken = await reader.call("bcp_next_query", {"timeout_s": scaled(10)})
    query = taken.structured_content["query"]
    assert query is not None, taken
    verdict = await reader.call("bcp_answer", {"query_id": query["query_id"], "response": response})
    return query, verdict


async def test_controller_and_reader_hosts_ask_answer_retry_and_push(tmp_path):
    """A controller host and a reader host complete a Cat-1 query, a Cat-2 query whose first
    answer is rejected and corrected, and a push; each host sees only its role's tools, and
    each is notified when its inbox changes."""
    async with (
        running_bcp(tmp_path) as h,
        host(h, "agent:main", mode="legacy") as main,
        host(h, "agent:researcher") as researcher,
    ):
        main_tools = (await main.client.list_tools()).tools
        reader_tools = (await researcher.client.list_tools()).tools
        assert names(main_tools) == names(BUS_TOOLS + CONTROLLER_TOOLS)
        assert names(reader_tools) == names(BUS_TOOLS + READER_TOOLS)
        ask = next(t for t in main_tools if t.name == "bcp_ask")
        assert "untrusted" in (ask.description or "")
        assert "QuerySpec" in ask.input_schema["$defs"]

        refused = await researcher.call("bcp_ask", {"reader": "main", "spec": CAT1})
        assert refused.is_error and "controller tool" in refused.content[0].text
        no_min = {"category": 1, "fields": [{"name": "n", "type": "integer", "max": 5}]}
        invalid = await main.call("bcp_ask", {"reader": "researcher", "spec": no_min})
        assert invalid.is_error and "an integer needs min and max" in invalid.content[0].text

        # Cat-1; the reader host, on the 2026-07-28 protocol, is told on its listen stream
        async with researcher.client.listen(resource_subscriptions=[INBOX_URI]) as stream:
            asking = asyncio.create_task(
                main.call("bcp_ask", {"reader": "researcher", "spec": CAT1})
            )
            async with asyncio.timeout(scaled(10)):
                event = await anext(aiter(stream))
        assert event.uri == INBOX_URI
        assert (await researcher.inbox())["queries_waiting"] == 1
        bad = await researcher.call("bcp_answer", {"query_id": "not an id!", "response": {}})
        assert bad.is_error and "query_id" in bad.content[0].text
        query, verdict = await answer(researcher, {"has_pricing": True, "tier": "pro"})
        assert (
            query["answer_format"]["keys"]["tier"] == "exactly one of ['free', 'pro', 'enterprise']"
        )
        assert not verdict.is_error and verdict.structured_content["success"] is True
        delivered = await asyncio.wait_for(asking, scaled(10))
        assert not delivered.is_error, delivered.content
        data = delivered.structured_content
        assert data["values"] == {"has_pricing": True, "tier": "pro"}
        assert data["taint"] == "medium" and data["untrusted"] is False
        assert data["bandwidth_bits"] == pytest.approx(1 + 1.585, abs=0.01)

        # Cat-2: four words for a three-word question is rejected, with the retries left
        asking = asyncio.create_task(main.call("bcp_ask", {"reader": "researcher", "spec": CAT2}))
        query, rejected = await answer(researcher, {"company": "the Acme Widget Company"})
        assert rejected.is_error
        assert rejected.structured_content["error"] == "validation_failed"
        assert rejected.structured_content["retries_left"] >= 1
        assert "answer again" in rejected.content[0].text
        fixed = await researcher.call(
            "bcp_answer", {"query_id": query["query_id"], "response": {"company": "Acme"}}
        )
        assert not fixed.is_error, fixed.content
        delivered = await asyncio.wait_for(asking, scaled(10))
        data = delivered.structured_content
        assert data["values"] == {"company": "Acme"} and data["untrusted"] is True
        text = delivered.content[0].text
        assert UNTRUSTED_NOTICE in text and '<value key="company">"Acme"</value>' in text

        # A push reaches the controller host's inbox, and the host is told
        pushed = await researcher.call(
            "bcp_publish",
            {
                "subscription_id": "research-alerts",
                "data": {"has_breaking_news": True, "priority": "high"},
            },
        )
        assert not pushed.is_error, pushed.content
        assert await main.updated() == INBOX_URI
        inbox = await main.inbox()
        push = inbox["messages"][-1]
        assert push["type"] == "bcp_response_delivery"
        assert push["subscription_id"] == "research-alerts"
        assert '<value key="priority">"high"</value>' in push["data"]


async def test_a_host_that_loses_the_bus_reconnects_and_misses_nothing(tmp_path):
    """What is sent to the peer while the bridge's connection is down reaches the host once it
    is back: a plain message (the SDK fetches what it missed since the last epoch it saw) and a
    push (the gateway held it)."""
    async with (
        running_bcp(tmp_path) as h,
        h.bus.peer("agent:helper") as sender,
        host(h, "agent:main", mode="legacy") as main,
    ):
        reader = h.reader("researcher")
        await reader.start()
        try:
            await sender.send("agent:main", "agent_event", {"n": 1})
            assert await main.updated() == INBOX_URI
            await h.bus.bus.peers["agent:main"].close(1001, "going away")
            await sender.send("agent:main", "agent_event", {"n": 2})
            alert = {"has_breaking_news": False, "priority": "low"}
            assert (await reader.publish("research-alerts", "main", alert)).success
            async with asyncio.timeout(scaled(10)):
                while True:  # one update per new entry: read until both are in
                    await main.updated()
                    inbox = await main.inbox()
                    types_in = {m["type"] for m in inbox["messages"]}
                    if len(inbox["messages"]) >= 3 and "bcp_response_delivery" in types_in:
                        break
            plain = [m for m in inbox["messages"] if m["type"] == "agent_event"]
            assert [m["content"] for m in plain] == [{"n": 1}, {"n": 2}]
            assert plain[0]["epoch"] < plain[1]["epoch"]
            pushed = [m for m in inbox["messages"] if m["type"] == "bcp_response_delivery"]
            # Once: fetched on reconnect and flushed by the gateway as well, with one delivery_id.
            assert [m["subscription_id"] for m in pushed] == ["research-alerts"]
            assert inbox["connected"] is True
        finally:
            await reader.close()


async def test_streamable_http_serves_the_same_tools(tmp_path):
    """`--http 0` prints the URL it listens on, then serves the bridge over streamable HTTP at
    /mcp: tools and the inbox."""
    async with running_bcp(tmp_path) as h:
        process = await asyncio.create_subprocess_exec(
            BCPBUS,
            *("mcp", "--url", h.bus.url, "--client-id", "agent:main"),
            *("--agents-dir", str(AGENTS), "--http", "0"),
            env={**os.environ, "BCPBUS_TOKEN": h.bus.token("agent:main")},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            async with asyncio.timeout(scaled(20)):
                line = (await process.stdout.readline()).decode().strip()
            assert line.startswith("listening on http://127.0.0.1:"), line
            url = line.removeprefix("listening on ")
            assert url.endswith("/mcp") and not url.endswith(":0/mcp"), url
            async with Client(url) as client:
                tools = (await client.list_tools()).tools
                assert names(tools) == names(BUS_TOOLS + CONTROLLER_TOOLS)
                channels = await client.call_tool("bcp_channels", {})
                assert channels.structured_content["channels"][0]["reader"] == "researcher"
                result = await client.read_resource(INBOX_URI)
                assert json.loads(result.contents[0].text)["client_id"] == "agent:main"
        finally:
            process.terminate()
            await process.wait()
