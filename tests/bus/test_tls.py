"""wss://: the bus with a certificate made at test time, the SDK and the terminal tools with
its CA file."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest
import trustme

from bus.assemble import running
from bus.ops.config import HttpSettings
from bus.ops.credentials import Credentials
from bus.ops.startup import StartupError
from bus.ops.tls import client_context, server_context
from peers import Peer
from peers.errors import ConnectFailed
from peers.testing import scaled

BCPBUS = str(Path(sys.executable).with_name("bcpbus"))


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    """A CA and a certificate for 127.0.0.1 and localhost, as PEM files."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"ca": tmp_path / "ca.pem", "cert": tmp_path / "cert.pem", "key": tmp_path / "key.pem"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    return files


async def test_the_sdk_connects_over_wss_with_the_ca_file_and_refuses_without(tmp_path, pki):
    """A bus with --certfile/--keyfile is wss://; a peer given the CA file connects and talks;
    one that trusts only the system's CAs is refused the handshake."""
    credentials = Credentials.empty()
    token = credentials.add_ephemeral("agent:w1", [])
    tls = server_context(pki["cert"], pki["key"])
    async with running(tmp_path / "a.db", credentials=credentials, ssl=tls) as bus:
        assert bus.url.startswith("wss://127.0.0.1:")
        async with Peer(bus.url, "agent:w1", token, reconnect=False, cafile=pki["ca"]) as peer:
            assert (await peer.ping()).pong is True
        with pytest.raises(ConnectFailed, match="certificate verify failed"):
            await Peer(bus.url, "agent:w1", token, reconnect=False).connect()
        plain = bus.url.replace("wss://", "ws://")
        with pytest.raises(ConnectFailed):
            await Peer(plain, "agent:w1", token, reconnect=False).connect()


def test_tls_files_are_checked_with_the_option_named(tmp_path, pki):
    """A key that does not match its certificate, or a CA file that is not PEM, is one line
    naming the options."""
    other = trustme.CA().issue_cert("127.0.0.1")
    other.private_key_pem.write_to_path(str(tmp_path / "other.key"))
    with pytest.raises(StartupError, match="--certfile .* --keyfile .*: cannot load them"):
        server_context(pki["cert"], tmp_path / "other.key")
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(StartupError, match="--cafile .*junk.pem: cannot load it"):
        client_context(tmp_path / "junk.pem")
    assert client_context(pki["ca"]).verify_mode.name == "CERT_REQUIRED"


async def test_serve_with_a_certificate_and_sub_with_the_ca_file(tmp_path, pki):
    """`bcpbus serve --certfile --keyfile` listens on wss://; `bcpbus pub --cafile` reaches it."""
    credentials = Credentials.empty()
    token = credentials.add("tg:1", [])
    credentials.save(tmp_path / "bcpbus-peers.yaml")
    process = await asyncio.create_subprocess_exec(
        BCPBUS,
        "serve",
        "--no-gateway",
        "--port",
        "0",
        "--certfile",
        str(pki["cert"]),
        "--keyfile",
        str(pki["key"]),
        "--http-port",
        "0",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(scaled(30)):
            line = (await process.stdout.readline()).decode().strip()
            http = (await process.stdout.readline()).decode().strip()
        assert line.startswith("listening on wss://127.0.0.1:"), line
        assert http.startswith("http on https://127.0.0.1:"), http
        url = line.removeprefix("listening on ")
        async with httpx.AsyncClient(verify=client_context(pki["ca"])) as client:
            health = await client.get(http.removeprefix("http on ") + "/healthz")
        assert health.status_code == 200
        args = ["pub", "agent:w1", "tg_message", "{}", "--url", url, "--as", "tg:1"]
        pub = await asyncio.create_subprocess_exec(
            BCPBUS,
            *args,
            "--token",
            token,
            "--cafile",
            str(pki["ca"]),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(scaled(30)):
            out, err = await pub.communicate()
        assert pub.returncode == 0, err.decode()
        assert json.loads(out)["accepted"] is True
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(scaled(30)):
            await process.wait()


async def test_the_http_port_serves_https_with_the_bus_certificate(tmp_path, pki):
    """With a certificate the HTTP port is https:// with the same one: a client with the CA
    file posts with its token; a plain http:// request gets no answer at all."""
    credentials = Credentials.empty()
    token = credentials.add_ephemeral("tg:1", [])
    tls = server_context(pki["cert"], pki["key"])
    http = HttpSettings(port=0)
    async with running(tmp_path / "a.db", credentials=credentials, ssl=tls, http=http) as bus:
        assert bus.http_url is not None and bus.http_url.startswith("https://127.0.0.1:")
        async with httpx.AsyncClient(base_url=bus.http_url, verify=client_context(pki["ca"])) as c:
            posted = await c.post(
                "/v1/messages",
                json={"topic": "agent:w1", "type": "tg_message", "content": {}},
                headers={"Authorization": f"Bearer {token}"},
            )
            assert posted.status_code == 202, posted.text
            discovery = (await c.get("/.well-known/bcpbus")).json()
            assert discovery["endpoints"]["http"] == bus.http_url
        plain = bus.http_url.replace("https://", "http://")
        async with httpx.AsyncClient(base_url=plain) as c:
            with pytest.raises(httpx.HTTPError):
                await c.get("/healthz", timeout=scaled(5))


async def test_an_http_binding_without_tls_beside_wss_refuses_to_start(tmp_path, pki):
    """An HTTP binding given no TLS context on a bus that serves wss:// is a one-line refusal,
    before anything listens."""
    from bus.transports.http import HttpBinding

    tls = server_context(pki["cert"], pki["key"])
    async with running(tmp_path / "a.db", credentials=Credentials.empty(), ssl=tls) as bus:
        with pytest.raises(StartupError, match="wss:// .* plain http://"):
            HttpBinding(bus, HttpSettings(port=0))
