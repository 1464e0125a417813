"""A real ``nats-server -js`` and real ``bcpbus serve --cluster`` nodes for the cluster tests.

``nats`` starts the NATS server on a free port with a store directory of its own and stops it
after the test; :meth:`NatsServer.restart` and :meth:`NatsServer.stop` are for failure tests.
``cluster`` starts nodes on it, each its own ``bcpbus serve`` process with its own database, all
sharing one peers file and one policy in the test's directory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pytest

from bus.ops.credentials import Credentials
from peers.testing import scaled

BCPBUS = str(Path(sys.executable).with_name("bcpbus"))
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}

POLICY = """\
version: 1
roles:
  worker:
    description: Workers of the cluster tests; they talk in rooms.
    members: ["w:*"]
    send:
      - types: [note]
        topics: ["room:*", "w:*"]
    subscribe: ["room:*", "w:{name}"]
  watcher:
    description: Watches presence.
    members: ["watch:*"]
    send: []
    subscribe: ["system:presence"]
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def wait_for_port(port: int, process: asyncio.subprocess.Process, seconds: float) -> None:
    """Return once ``127.0.0.1:port`` accepts a connection; fail if ``process`` exits first
    or ``seconds`` (scaled) pass."""
    async with asyncio.timeout(scaled(seconds)):
        while True:
            if process.returncode is not None:
                raise AssertionError(f"exited with {process.returncode} before listening")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.02)  # polling the port: nothing to wait on before it opens
                continue
            writer.close()
            await writer.wait_closed()
            return


@dataclass
class NatsServer:
    """A ``nats-server`` with JetStream on a free port; its store survives a restart."""

    store: Path
    jetstream: bool = True
    port: int = field(default_factory=free_port)
    process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self) -> None:
        binary = shutil.which("nats-server")
        if binary is None:
            pytest.skip("nats-server is not installed (.ci/run installs Debian's)")
        self.process = await asyncio.create_subprocess_exec(
            binary,
            *("-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store)),
            *(("-js",) if self.jetstream else ()),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await wait_for_port(self.port, self.process, 30)

    async def stop(self, sig: int = signal.SIGTERM) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        process.send_signal(sig)
        async with asyncio.timeout(scaled(30)):
            await process.wait()

    async def restart(self) -> None:
        """Stop the server and start it again on the same port and store."""
        await self.stop()
        await self.start()


@pytest.fixture
async def nats(tmp_path: Path) -> AsyncIterator[NatsServer]:
    server = NatsServer(tmp_path / "nats-store")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@dataclass
class Node:
    """One ``bcpbus serve --cluster`` process."""

    name: str
    db: Path
    port: int
    process: asyncio.subprocess.Process

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.returncode is None:
            self.process.send_signal(sig)
        async with asyncio.timeout(scaled(30)):
            return await self.process.wait()


@dataclass
class Cluster:
    """Nodes on one NATS server, sharing the peers file and policy in ``root``.

    With ``policy`` False the nodes run the built-in policy and the reference agents (BCP).
    """

    root: Path
    nats: NatsServer
    nodes: list[Node] = field(default_factory=list)
    policy: bool = True

    def token(self, client_id: str) -> str:
        """A credential for ``client_id`` in the shared peers file (nodes read it on start)."""
        path = self.root / "bcpbus-peers.yaml"
        credentials = Credentials.load(path)
        token = credentials.add(client_id, [])
        credentials.save(path)
        return token

    async def node(self, name: str, nats_url: str | None = None) -> Node:
        """Start node ``name`` on the NATS server (or on ``nats_url``: a relay to it)."""
        port = free_port()
        with (self.root / f"{name}.log").open("ab") as log:  # read it when a test fails
            process = await self._serve(name, port, log, nats_url or self.nats.url)
        node = Node(name, self.root / f"{name}.db", port, process)
        self.nodes.append(node)
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            line = (await process.stdout.readline()).decode()
        assert line.startswith(f"listening on {node.url}"), line
        return node

    async def _serve(
        self, name: str, port: int, log: BinaryIO, nats_url: str
    ) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            BCPBUS,
            *("--info", "serve", "--port", str(port), "--no-gateway", "--no-checkpoints"),
            *("--db", f"{name}.db"),
            *(("--policy", "policy.yaml") if self.policy else ()),
            *("--cluster", nats_url, "--node", name),
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=log,
            env=ENV,
        )

    async def close(self) -> None:
        for node in self.nodes:
            await node.stop()


@pytest.fixture
async def cluster(tmp_path: Path, nats: NatsServer) -> AsyncIterator[Cluster]:
    (tmp_path / "policy.yaml").write_text(POLICY)
    Credentials.empty().save(tmp_path / "bcpbus-peers.yaml")
    group = Cluster(tmp_path, nats)
    try:
        yield group
    finally:
        await group.close()
