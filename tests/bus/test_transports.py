"""What a WebSocket transport must do beyond the wire suite, the same on websockets and picows
(fragments, bad UTF-8, pings, wss://), and how ``--transport`` / ``transport:`` choose one."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bus import cli
from bus.assemble import door_for, running
from bus.ops.config import ConfigError, Limits, ServeConfig
from bus.ops.credentials import Credentials
from bus.ops.startup import StartupError
from bus.ops.tls import server_context
from bus.transports.websocket import WebSocketDoor
from peers import Peer
from peers.testing import running_bus, scaled

from .conftest import HAS_PICOWS

BCPBUS = str(Path(sys.executable).with_name("bcpbus"))

PING = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})


async def pieces(text: str, size: int) -> AsyncIterator[str]:
    """``text`` in fragments of ``size`` characters: one message over several frames."""
    for start in range(0, len(text), size):
        yield text[start : start + size]


async def closed_with(ws: Any) -> int:
    """Wait for the bus to close ``ws``; return the code it sent."""
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(scaled(5)):
            while True:
                await ws.recv()
    return int(ws.close_code)


@pytest.mark.usefixtures("each_transport")
async def test_a_fragmented_message_is_read_as_one(tmp_path):
    """A request sent in four fragments is answered once, as if sent in one frame."""
    async with running_bus(tmp_path) as h, connect(h.url) as ws:
        await ws.send(pieces(PING, len(PING) // 4 + 1))
        async with asyncio.timeout(scaled(5)):
            answer = json.loads(await ws.recv())
        # Not initialized yet: the answer is the session's own, which shows the text arrived whole.
        assert answer["id"] == 1 and answer["error"]["code"] == -32001


@pytest.mark.usefixtures("each_transport")
async def test_fragments_over_max_frame_bytes_close_with_1009(tmp_path):
    """Fragments each under max_frame_bytes but over it together close the link with 1009."""
    async with running_bus(tmp_path, limits=Limits(max_frame_bytes=1000)) as h:
        async with connect(h.url) as ws:
            await ws.send(pieces("x" * 1800, 600))
            assert await closed_with(ws) == 1009
        await h.bus.close()
        assert await h.refused() == {"frame_too_large": 1}


def masked(first: int, payload: bytes) -> bytes:
    """A client frame written by hand: ``first`` (FIN and opcode), a zero mask, ``payload``."""
    return bytes([first, 0x80 | len(payload)]) + b"\x00" * 4 + payload


@pytest.mark.usefixtures("each_transport")
@pytest.mark.parametrize(
    "frames",
    [
        [masked(0x80, PING.encode())],  # a continuation with nothing to continue
        [masked(0x01, PING[:10].encode()), masked(0x81, PING.encode())],  # a new text mid-message
    ],
    ids=["lone-continuation", "text-inside-fragments"],
)
async def test_fragments_out_of_order_close_with_1002(tmp_path, frames):
    """A continuation frame with no message begun, or a new data frame inside a fragmented
    message, is a protocol error (RFC 6455 5.4): the link closes with 1002, nothing answered."""
    async with running_bus(tmp_path) as h, connect(h.url) as ws:
        ws.transport.write(b"".join(frames))
        assert await closed_with(ws) == 1002


@pytest.mark.usefixtures("each_transport")
async def test_invalid_utf8_in_a_text_frame_closes_with_1007(tmp_path):
    """A text frame that is not UTF-8 closes the link with 1007 (invalid frame payload data)."""
    async with running_bus(tmp_path) as h, connect(h.url) as ws:
        await ws.send(b'{"jsonrpc": "2.0", "id": 1, "method": "\xff"}', text=True)
        assert await closed_with(ws) == 1007


@pytest.mark.usefixtures("each_transport")
async def test_a_ping_is_answered(tmp_path):
    """A WebSocket ping gets its pong, and the link stays open for requests."""
    async with running_bus(tmp_path) as h, connect(h.url) as ws:
        pong = await ws.ping(b"are you there")
        async with asyncio.timeout(scaled(5)):
            await pong
        await ws.send(PING)
        async with asyncio.timeout(scaled(5)):
            assert json.loads(await ws.recv())["id"] == 1


async def test_wss_on_each_transport(tmp_path, each_transport):
    """With a certificate either transport serves wss://, and the SDK with the CA file pings."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    credentials = Credentials.empty()
    token = credentials.add_ephemeral("tg:1", [])
    tls = server_context(tmp_path / "cert.pem", tmp_path / "key.pem")
    async with running(
        tmp_path / "log.db", credentials=credentials, ssl=tls, transport=each_transport
    ) as bus:
        assert bus.url.startswith("wss://127.0.0.1:")
        async with Peer(bus.url, "tg:1", token, cafile=str(tmp_path / "ca.pem")) as peer:
            assert (await peer.ping()).pong is True


@pytest.mark.skipif(not HAS_PICOWS, reason="picows is not installed: pip install 'bcpbus[picows]'")
async def test_serve_with_transport_picows(tmp_path):
    """`bcpbus serve --transport picows` serves peers: the SDK initializes and pings."""
    credentials = Credentials.empty()
    token = credentials.add("tg:1", [])
    credentials.save(tmp_path / "bcpbus-peers.yaml")
    process = await asyncio.create_subprocess_exec(
        *(BCPBUS, "serve", "--no-gateway", "--no-checkpoints", "--port", "0"),
        *("--transport", "picows"),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            line = (await process.stdout.readline()).decode().strip()
        assert line.startswith("listening on ws://127.0.0.1:"), line
        async with Peer(line.removeprefix("listening on "), "tg:1", token) as peer:
            assert (await peer.ping()).pong is True
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            assert await process.wait() == 0


def test_without_picows_the_transport_is_refused_naming_the_extra(tmp_path, monkeypatch):
    """With picows missing, --transport picows stops serve before it opens anything, with a
    one-line message saying what to install; websockets needs nothing more."""
    monkeypatch.setitem(sys.modules, "picows", None)  # import picows now raises ImportError
    for name in ("bus.transports.picows_door", "bus.transports.picows_socket"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match=r"pip install 'bcpbus\[picows\]'"):
        door_for("picows")
    assert door_for("websockets") is WebSocketDoor
    config = ServeConfig(transport="picows", db=tmp_path / "log.db", port=0)
    with pytest.raises(StartupError, match=r"--transport picows needs the picows extra"):
        cli._checked(config)
    assert not (tmp_path / "log.db").exists()


def test_the_config_file_chooses_the_transport(tmp_path):
    """`transport: picows` in the config file is read; another name is refused with its key."""
    config = ServeConfig.from_mapping({"transport": "picows"}, base=tmp_path, source="c.yaml")
    assert config.transport == "picows"
    assert ServeConfig().transport == "websockets"
    with pytest.raises(ConfigError, match="transport"):
        ServeConfig.from_mapping({"transport": "tornado"}, base=tmp_path, source="c.yaml")
