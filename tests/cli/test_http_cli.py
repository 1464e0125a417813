"""`bcpbus serve --http-port` and `bcpbus peers add --webhook` through real subprocesses."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from bus import cli as bus_cli
from peers import Peer
from peers.testing import scaled
from tests.bus.webhook_receiver import Receiver

BCPBUS = [str(Path(sys.executable).with_name("bcpbus"))]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BCPBUS, *args], cwd=cwd, capture_output=True, text=True, timeout=scaled(60)
    )


@asynccontextmanager
async def serving_http(cwd: Path, *more: str) -> AsyncIterator[tuple[str, str]]:
    """`bcpbus serve --port 0 --http-port 0 --no-gateway`; yield (ws URL, http URL)."""
    process = await asyncio.create_subprocess_exec(
        *BCPBUS,
        "serve",
        "--port",
        "0",
        "--http-port",
        "0",
        "--no-gateway",
        *more,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            first = (await process.stdout.readline()).decode().strip()
            second = (await process.stdout.readline()).decode().strip()
        assert first.startswith("listening on ws://"), first
        assert second.startswith("http on http://"), second
        yield first.removeprefix("listening on "), second.removeprefix("http on ")
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            code = await process.wait()
        assert code == 0, (await process.stderr.read()).decode()  # type: ignore[union-attr]


def test_peers_add_webhook_prints_token_and_secret_and_lists_the_url(tmp_path, capsys):
    """--webhook adds a second stdout line, the secret; `peers list` shows the URL."""
    peers = ["peers", "--peers-file", str(tmp_path / "peers.yaml")]
    url = "https://hooks.example.com/in"
    assert bus_cli.main([*peers, "add", "tg:7", "--webhook", url, "--subscribe", "x:y"]) == 0
    out, err = capsys.readouterr()
    token, secret = out.split()
    assert token.startswith("bcpbus_") and secret.startswith("whsec_")
    assert "webhook secret" in err
    assert bus_cli.main([*peers, "list"]) == 0
    assert capsys.readouterr().out.strip() == f"tg:7\t-\t{url}"
    assert bus_cli.main([*peers, "add", "tg:8", "--subscribe", "x:y"]) == 2
    assert "--webhook" in capsys.readouterr().err
    assert bus_cli.main([*peers, "add", "tg:9", "--webhook", "ftp://x/y"]) == 2
    assert "webhook URL" in capsys.readouterr().err
    assert bus_cli.main([*peers, "list"]) == 0
    assert "tg:9" not in capsys.readouterr().out


async def test_serve_with_http_reaches_a_webhook_peer_from_the_peers_file(tmp_path):
    """The curl walk-through: POST as one peer, deliver to a webhook peer from the file."""
    async with Receiver(secret="") as receiver:
        added = run(
            "peers",
            "add",
            "tg:7",
            "--webhook",
            receiver.url,
            "--allow-private-webhook",
            cwd=tmp_path,
        )
        _, receiver.secret = added.stdout.split()
        agent = run("peers", "add", "agent:w1", cwd=tmp_path).stdout.strip()
        # The receiver is on 127.0.0.1: the operator allows webhooks on private addresses.
        (tmp_path / "bcpbus.yaml").write_text("http:\n  allow_private_webhooks: true\n")
        config = ("--config", str(tmp_path / "bcpbus.yaml"))
        async with serving_http(tmp_path, *config) as (ws_url, http_url):
            async with Peer(ws_url, "agent:w1", agent) as w1:
                result = await w1.send("tg:7", "tg_reply", {"text": "hi"}, message_id="w-1")
                assert result.delivered_to == 1
            async with httpx.AsyncClient(base_url=http_url) as client:
                posted = await client.post(
                    "/v1/messages?wait=true",
                    json={"topic": "agent:w1", "type": "tg_message", "content": {}},
                    headers={"Authorization": f"Bearer {added.stdout.split()[0]}"},
                )
                assert posted.status_code == 200 and posted.json()["deliveredTo"] == 0
                metrics = (await client.get("/metrics")).text
        assert receiver.posts[0].signed and receiver.posts[0].message["params"]["topic"] == "tg:7"
        assert 'bcpbus_peers{link="webhook"} 1.0' in metrics


def test_peers_add_refuses_a_private_webhook_address_without_the_flag(tmp_path, capsys):
    """A webhook at a loopback or link-local address is refused in one line naming the opt-ins;
    with --allow-private-webhook it is added."""
    peers = ["peers", "--peers-file", str(tmp_path / "peers.yaml")]
    for url in ("http://127.0.0.1:9/in", "http://169.254.169.254/x", "http://localhost/x"):
        assert bus_cli.main([*peers, "add", "tg:7", "--webhook", url]) == 2
        err = capsys.readouterr().err
        assert "not a public address" in err and "--allow-private-webhook" in err, err
        assert "http.allow_private_webhooks" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "peers.yaml").exists()
    url = "http://127.0.0.1:9/in"
    assert bus_cli.main([*peers, "add", "tg:7", "--webhook", url, "--allow-private-webhook"]) == 0
    assert capsys.readouterr().out.split()[1].startswith("whsec_")
