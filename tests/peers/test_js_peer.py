"""The Node.js reader in peers/examples/js against a real bus, gateway and Python controller."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from bus.ops.config import Limits
from peers.testing import BcpHarness, running_bcp, scaled

JS_DIR = Path(__file__).resolve().parents[2] / "peers" / "examples" / "js"
READER_JS = JS_DIR / "reader.mjs"

ALERT = {
    "category": 1,
    "fields": [
        {"name": "priority", "type": "enum", "values": ["low", "medium", "high", "critical"]},
        {"name": "has_breaking_news", "type": "boolean"},
        {"name": "confidence", "type": "integer", "min": 1, "max": 5},
    ],
}


def find_node(ci: bool) -> str:
    """The node executable that runs the example peer.

    Skips only on a developer's machine without node. In CI (``CI`` set, as .ci/run runs) a
    missing node fails, and missing dependencies fail everywhere: a test that skips there would
    hide that the JavaScript peer was never run.
    """
    executable = shutil.which("node")
    if executable is None:
        if ci:
            pytest.fail("CI: node is not installed, so the JavaScript example peer cannot run")
        pytest.skip("node is not installed: the JavaScript example peer cannot run")
    if not (JS_DIR / "node_modules" / "ws").is_dir():
        pytest.fail(f"the JavaScript example's dependencies are missing: run `npm ci` in {JS_DIR}")
    return executable


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


@pytest.fixture
def node() -> str:
    return find_node(in_ci())


def test_missing_dependencies_fail_instead_of_skipping(monkeypatch, tmp_path):
    """Without node_modules the JavaScript tests fail, in CI and out; only a machine without
    node, outside CI, skips them."""
    monkeypatch.setattr(f"{__name__}.JS_DIR", tmp_path)
    if shutil.which("node") is not None:
        with pytest.raises(pytest.fail.Exception, match="npm ci"):
            find_node(ci=True)
        with pytest.raises(pytest.fail.Exception, match="npm ci"):
            find_node(ci=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no node on it
    with pytest.raises(pytest.fail.Exception, match="CI: node is not installed"):
        find_node(ci=True)
    with pytest.raises(pytest.skip.Exception):
        find_node(ci=False)


class JsReader:
    """``node reader.mjs`` as a subprocess, with its stdout events (JSON lines) in order."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.events: list[dict[str, Any]] = []
        self.stderr = b""
        self._taken: set[int] = set()
        self._changed = asyncio.Condition()

    async def read_stdout(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            async with self._changed:
                self.events.append(json.loads(line))
                self._changed.notify_all()

    async def read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr = await self.process.stderr.read()

    async def next(
        self, event: str, where: Callable[[dict[str, Any]], bool] = lambda e: True
    ) -> dict[str, Any]:
        """Return the first ``event`` line satisfying ``where`` not returned before, waiting
        for it; lines of different events may come in any order."""

        def found() -> dict[str, Any] | None:
            for index, line in enumerate(self.events):
                if index not in self._taken and line["event"] == event and where(line):
                    self._taken.add(index)
                    return line
            return None

        try:
            async with asyncio.timeout(scaled(10)), self._changed:
                while (line := found()) is None:
                    if self.process.returncode is not None:
                        raise AssertionError(f"reader.mjs exited early: {self.diagnostics()}")
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(f"no {event!r} line: {self.diagnostics()}") from None
        return line

    def diagnostics(self) -> str:
        return f"events {self.events}, stderr {self.stderr.decode(errors='replace')!r}"


@contextlib.asynccontextmanager
async def js_reader(node: str, h: BcpHarness) -> AsyncIterator[JsReader]:
    """Run reader.mjs as agent:researcher until it is ready; SIGTERM it on exit, expecting 0."""
    env = {**os.environ, "BCPBUS_TOKEN": h.bus.token("agent:researcher")}
    process = await asyncio.create_subprocess_exec(
        node,
        str(READER_JS),
        h.bus.url,
        "agent:researcher",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    reader = JsReader(process)
    readers = asyncio.gather(reader.read_stdout(), reader.read_stderr())
    try:
        await reader.next("ready")
        yield reader
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(scaled(10)):
                await readers
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
    assert process.returncode == 0, reader.diagnostics()
    assert reader.events[-1]["event"] == "closed"


@contextlib.asynccontextmanager
async def controller(h: BcpHarness) -> AsyncIterator[tuple[Any, asyncio.Queue[dict[str, Any]]]]:
    """A started Controller for agent:main and the queue its pushes arrive on."""
    main = h.controller("main")
    pushes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def pushed(content: dict[str, Any]) -> None:
        pushes.put_nowait(content)

    main.on_delivery(pushed)
    await main.start()
    try:
        yield main, pushes
    finally:
        await main.close()


async def test_js_reader_answers_a_query_and_pushes(tmp_path, node):
    """A Cat-1 query answered by the JS reader and its research-alerts push reach main validated."""
    async with running_bcp(tmp_path) as h, controller(h) as (main, pushes):
        async with js_reader(node, h) as reader:
            # Its push on the first Cat-1 subscription, sent when the gateway listed them.
            assert (await reader.next("subscriptions"))["ids"] == [
                "research-findings",
                "research-alerts",
            ]
            async with asyncio.timeout(scaled(10)):
                push = await pushes.get()
            assert push.pop("delivery_id").startswith("d-")
            # The push's value and its outcome bit; when on the grid it came is the reader's
            # choice, charged at least one bit (docs/bcp.md, "Time").
            bits = push.pop("bits")
            assert bits["value"] == 3.0 and bits["outcome"] == 1.0 and bits["timing"] >= 1.0
            assert push == {
                "subscription_id": "research-alerts",
                "category": 1,
                "from_agent": "researcher",
                "response": {"has_breaking_news": True, "priority": "high"},
                "bandwidth_bits": 3.0,
                "taint": "medium",
                "channel_mode": "bcp",
            }
            sent = await reader.next("push")
            assert sent["result"]["deliveredTo"] == 1
            verdict = await reader.next(
                "validation_result", lambda e: e.get("subscription_id") == "research-alerts"
            )
            assert verdict["success"] is True and verdict["correlationId"] == sent["messageId"]

            # A query, answered from the canned table.
            delivery = await main.ask("researcher", ALERT, query_id="js-q1", timeout=scaled(10))
            assert list(delivery.response) == ["priority", "has_breaking_news", "confidence"]
            assert delivery.response == {
                "priority": "high",
                "has_breaking_news": True,
                "confidence": 4,
            }
            assert delivery.bandwidth_bits == pytest.approx(3 + math.log2(5), abs=1e-3)
            assert delivery.taint == "medium" and delivery.from_agent == "researcher"
            assert delivery.query_id == "js-q1" and delivery.channel_mode == "bcp"
            answered = await reader.next("answer", lambda e: e["query_id"] == "js-q1")
            verdict = await reader.next("validation_result", lambda e: e.get("query_id") == "js-q1")
            assert verdict["success"] is True and verdict["correlationId"] == answered["messageId"]


async def test_js_reader_retries_after_a_validation_failure(tmp_path, node):
    """The JS reader's canned enum value fails validation; its corrected retry is delivered."""
    spec = {
        "category": 1,
        "fields": [
            {"name": "has_breaking_news", "type": "boolean"},
            {"name": "priority", "type": "enum", "values": ["low", "medium"]},
        ],
    }
    async with running_bcp(tmp_path) as h, controller(h) as (main, _pushes):
        async with js_reader(node, h) as reader:
            delivery = await main.ask("researcher", spec, query_id="js-q2", timeout=scaled(10))
            assert delivery.response == {"has_breaking_news": True, "priority": "low"}
            assert delivery.bandwidth_bits == 2.0 and delivery.taint == "medium"

            def about_q2(event: dict[str, Any]) -> bool:
                return event.get("query_id") == "js-q2"

            first = await reader.next("validation_result", about_q2)
            assert first["success"] is False and first["error"] == "validation_failed"
            assert first["retries_left"] == 2
            assert [(r["field"], r["code"]) for r in first["reasons"]] == [
                ("priority", "not_a_member")
            ]
            second = await reader.next("validation_result", about_q2)
            assert second["success"] is True
            retry = await reader.next(
                "answer", lambda e: e["query_id"] == "js-q2" and e["attempt"] == 2
            )
            assert second["correlationId"] == retry["messageId"]


async def test_js_reader_gets_in_while_strangers_fill_its_address_s_cap(tmp_path, node):
    """Idle anonymous sockets fill 127.0.0.1's cap; reader.mjs, which sends its token at the
    handshake, still connects and gets ready without evicting any of them."""
    limits = Limits(max_anonymous_per_address=3, initialize_timeout=scaled(120))
    async with running_bcp(tmp_path, limits=limits) as h:
        idle = [await connect(h.bus.url) for _ in range(3)]
        try:
            async with js_reader(node, h) as reader:  # it waits for the reader's `ready`
                assert "ready" in [event["event"] for event in reader.events]
            assert all(ws.close_code is None for ws in idle)
        finally:
            for ws in idle:
                await ws.close()


CONTROLLER_JS = JS_DIR / "controller.mjs"


async def test_js_controller_forwards_a_sealed_answer_it_never_reads(tmp_path, node):
    """controller.mjs asks a sealed question, gets a handle and a word count, and forwards the
    text to a chat; the text reaches the chat and never the JavaScript process's output."""
    text = "The quarterly figures rose by four percent in the northern region this year"
    async with running_bcp(tmp_path) as h:
        reader = h.reader("researcher")

        async def answer(query: dict[str, Any]) -> dict[str, Any]:
            return {"finding": text}

        reader.on_query(answer)
        chat = h.bus.peer("tg:alice")
        replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        async def replied(message: Any) -> bool:
            replies.put_nowait(message.content)
            return True

        chat.handle("tg_reply", replied)
        async with reader, chat:
            env = {**os.environ, "BCPBUS_TOKEN": h.bus.token("agent:main")}
            process = await asyncio.create_subprocess_exec(
                node,
                str(CONTROLLER_JS),
                h.bus.url,
                "agent:main",
                "researcher",
                "tg:alice",
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(scaled(20)):
                out, err = await process.communicate()
                got = await replies.get()
        assert process.returncode == 0, err.decode(errors="replace")
        events = [json.loads(line) for line in out.decode().splitlines()]
        assert [e["event"] for e in events] == ["ready", "sealed", "forwarded"]
        assert events[1]["words"] == 13 and events[1]["format"] == "short_text"
        assert "quarterly" not in out.decode() and "quarterly" not in err.decode()
        assert got["text"] == text and got["untrusted"] is True
