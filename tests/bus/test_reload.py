"""Reloading the peers file, the policy and the agent definitions under a running bus."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from bus.assemble import running
from bus.core.errors import CLOSE_REVOKED, AuthenticationFailed
from bus.core.policy import Policy
from bus.ops.credentials import Credentials
from bus.ops.reload import BusFiles, Reloader, stamp
from bus.server import Bus
from peers import Peer
from peers.testing import Inbox, scaled

POLICY = """\
version: 1
roles:
  agent:
    members: ["agent:*"]
    send:
      - types: [note]
        topics: ["agent:*", "team:*"]
    subscribe: ["agent:{name}", "team:*"]
"""


@dataclass
class Setup:
    bus: Bus
    reloader: Reloader
    said: list[str]
    peers_file: Path
    policy: Path
    db: Path

    def add(self, client_id: str) -> str:
        credentials = Credentials.load(self.peers_file)
        token = credentials.add(client_id, [])
        credentials.save(self.peers_file)
        return token

    async def rows(self, event: str) -> list[dict[str, Any]]:
        await self.bus.log.commit()
        with contextlib.closing(sqlite3.connect(self.db)) as db:
            db.row_factory = sqlite3.Row
            query = "SELECT * FROM activity_log WHERE event = ? ORDER BY id"
            return [dict(row) for row in db.execute(query, (event,))]


@contextlib.asynccontextmanager
async def reloading(tmp_path: Path, *, interval: float | None = None) -> AsyncIterator[Setup]:
    """A bus on port 0 with a peers file and a policy file, and a reloader for them."""
    peers_file, policy, db = tmp_path / "peers.yaml", tmp_path / "policy.yaml", tmp_path / "a.db"
    policy.write_text(POLICY)
    Credentials.empty().save(peers_file)
    credentials = Credentials.load(peers_file)
    async with running(db, credentials=credentials, policy=Policy.load(policy)) as bus:
        said: list[str] = []
        reloader = Reloader(bus.log, say=said.append, interval=interval)
        reloader.add(BusFiles(bus, peers_file=peers_file, policy=policy, agents_dir=None))
        async with reloader:
            yield Setup(bus, reloader, said, peers_file, policy, db)


async def initialized(url: str, client_id: str, token: str) -> Any:
    ws = await connect(url)
    params = {"clientId": client_id, "auth": {"token": token}}
    await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}))
    async with asyncio.timeout(scaled(5)):
        assert "result" in json.loads(await ws.recv())
    return ws


async def closed_with(ws: Any) -> int:
    """Read until the bus closes ``ws``; return the close code."""
    with pytest.raises(ConnectionClosed):
        async with asyncio.timeout(scaled(5)):
            while True:
                await ws.recv()
    code: int = ws.close_code
    return code


async def test_a_peer_added_to_the_file_connects_after_the_change_is_seen(tmp_path):
    """A peer added to the peers file under a running bus connects once the change is seen,
    without a restart."""
    async with reloading(tmp_path, interval=0.05) as s:
        s.reloader.reloaded.clear()
        token = s.add("agent:w1")
        async with asyncio.timeout(scaled(5)):
            await s.reloader.reloaded.wait()
        async with Peer(s.bus.url, "agent:w1", token, reconnect=False) as peer:
            assert (await peer.ping()).pong is True
        assert (await s.rows("reload"))[-1]["status"] == "ok"
        assert s.said[-1].startswith("bcpbus: reloaded (bus: 1 peer, 1 roles, 0 agents")


async def test_a_rotated_token_closes_the_connection_with_4005(tmp_path):
    """Rotating a connected peer's token closes its connection with 4005, logs a revoked row
    and announces peer_left with reason revoked; the new token works."""
    async with reloading(tmp_path) as s:
        old = s.add("agent:w1")
        watcher_token = s.add("agent:watch")
        assert s.reloader.reload()
        ws = await initialized(s.bus.url, "agent:w1", old)
        new = s.add("agent:w1")  # replaces the hash: a rotation
        assert s.reloader.reload()
        assert await closed_with(ws) == CLOSE_REVOKED
        revoked = await s.rows("revoked")
        assert [(r["actor"], r["status"]) for r in revoked] == [("agent:w1", "rotated")]
        with pytest.raises(AuthenticationFailed):
            await Peer(s.bus.url, "agent:w1", old, reconnect=False).connect()
        async with Peer(s.bus.url, "agent:w1", new, reconnect=False) as peer:
            assert (await peer.ping()).pong is True
        assert watcher_token  # an unrelated peer's token is untouched by the rotation


async def test_a_removed_peer_is_closed_and_others_stay(tmp_path):
    """Removing one peer from the file closes it (4005) and leaves the other connected."""
    async with reloading(tmp_path) as s:
        gone, kept = s.add("agent:gone"), s.add("agent:kept")
        assert s.reloader.reload()
        ws_gone = await initialized(s.bus.url, "agent:gone", gone)
        async with Peer(s.bus.url, "agent:kept", kept, reconnect=False) as peer:
            credentials = Credentials.load(s.peers_file)
            credentials.remove("agent:gone")
            credentials.save(s.peers_file)
            assert s.reloader.reload()
            assert await closed_with(ws_gone) == CLOSE_REVOKED
            assert (await peer.ping()).pong is True
        assert (await s.rows("revoked"))[0]["status"] == "removed"


async def test_shrunk_rights_drop_the_subscriptions_no_longer_allowed(tmp_path):
    """A policy that no longer allows team:* drops that subscription: nothing more arrives on
    it, the own-address subscription stays, and an unsubscribe row says revoked."""
    async with reloading(tmp_path) as s:
        reader_token, writer_token = s.add("agent:r"), s.add("agent:w")
        assert s.reloader.reload()
        inbox = Inbox()
        async with (
            Peer(s.bus.url, "agent:r", reader_token, reconnect=False) as reader,
            Peer(s.bus.url, "agent:w", writer_token, reconnect=False) as writer,
        ):
            reader.handle(None, inbox)
            await reader.subscribe("team:*")
            assert (await writer.send("team:x", "note", {})).delivered_to == 1
            await inbox.get()
            s.policy.write_text(POLICY.replace('"agent:{name}", "team:*"', '"agent:{name}"'))
            assert s.reloader.reload()
            assert (await writer.send("team:x", "note", {})).delivered_to == 0
            assert (await writer.send("agent:r", "note", {})).delivered_to == 1
            assert (await inbox.get()).topic == "agent:r"
        rows = await s.rows("unsubscribe")
        assert [(r["actor"], r["topic"], r["status"]) for r in rows] == [
            ("agent:r", "team:*", "revoked")
        ]


async def test_an_invalid_reload_keeps_the_running_configuration(tmp_path):
    """A broken policy file fails the whole reload: the peers file change in the same reload is
    not applied either; one line says why, and a reload row has status failed."""
    async with reloading(tmp_path) as s:
        token = s.add("agent:w1")
        s.policy.write_text("version: 1\nroles: {}\n")
        assert not s.reloader.reload()
        line = s.said[-1]
        assert line.startswith("bcpbus: reload failed, the running configuration stays: ")
        assert "policy.yaml" in line and "\n" not in line
        failed = (await s.rows("reload"))[-1]
        assert failed["status"] == "failed" and "policy.yaml" in failed["error"]
        with pytest.raises(AuthenticationFailed):  # the new peer was not put in force
            await Peer(s.bus.url, "agent:w1", token, reconnect=False).connect()
        s.policy.write_text(POLICY)
        assert s.reloader.reload()
        async with Peer(s.bus.url, "agent:w1", token, reconnect=False):
            pass


async def test_trigger_reloads_without_a_change(tmp_path):
    """trigger() (SIGHUP) reloads even when no file changed."""
    async with reloading(tmp_path, interval=None) as s:
        s.reloader.reloaded.clear()
        s.reloader.trigger()
        async with asyncio.timeout(scaled(5)):
            await s.reloader.reloaded.wait()
        assert [r["status"] for r in await s.rows("reload")] == ["ok"]


def test_stamp_sees_a_file_changed_in_a_directory(tmp_path):
    """Editing a file inside a watched directory changes the stamp; reading it does not."""
    (tmp_path / "a.md").write_text("one")
    before = stamp([tmp_path])
    assert stamp([tmp_path]) == before
    (tmp_path / "a.md").write_text("two!")
    assert stamp([tmp_path]) != before
