"""Webhooks reach public addresses only unless the operator allows others: checked at start for
an address in the URL, and at each connection for what a name resolves to."""

from __future__ import annotations

import socket

import pytest

from bus.core.errors import AuthenticationFailed
from bus.transports.egress import is_public, private_host
from peers.testing import Inbox, running_bus, scaled
from schemas.bus import DeliveryStatus

from .test_http import settings


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:127.0.0.1",
        "not an address",
    ],
)
def test_non_public_addresses_are_refused(address):
    """Loopback, private, link-local, shared, unspecified, multicast, mapped: none is public."""
    assert not is_public(address)


def test_public_addresses_and_names_pass_the_start_check():
    """A public address or any name passes at start (a name is checked when connecting)."""
    assert is_public("93.184.215.14") and is_public("2606:2800:21f:cb07:6820:80da:af6b:8b2c")
    assert private_host("https://93.184.215.14/hook") is None
    assert private_host("https://hooks.example.com/x") is None
    assert private_host("http://LOCALHOST.:8080/x") == "localhost"
    assert private_host("http://[::1]:8080/x") == "::1"
    assert private_host("http://169.254.169.254/latest/meta-data") == "169.254.169.254"


async def test_a_webhook_at_a_private_address_is_not_attached_without_the_opt_in(tmp_path):
    """Without allow_private_webhooks, a webhook at 127.0.0.1 is refused with a row saying why."""
    async with running_bus(tmp_path, http=settings(allow_private_webhooks=False)) as h:
        with pytest.raises(AuthenticationFailed, match="allow_private_webhooks"):
            await h.webhook_peer("tg:42", "http://127.0.0.1:9/hook")
        await h.log.commit()
        rows = h.rows(event="auth_failed", actor="tg:42")
        assert [(r["status"], r["error"]) for r in rows] == [("private_webhook", "127.0.0.1")]
        assert "tg:42" not in h.bus.peers


async def test_a_name_that_resolves_to_a_private_address_is_never_connected_to(tmp_path):
    """A webhook named by a host name passes at start, and its POST is refused when the name
    resolves to a non-public address: the sender learns `refused`, nothing was connected to."""
    name = socket.gethostname()
    resolved = {info[4][0] for info in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    if any(is_public(address) for address in resolved):
        pytest.skip(f"{name} resolves to a public address here")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    http = settings(allow_private_webhooks=False, webhook_attempts=1)
    try:
        async with running_bus(tmp_path, http=http) as h:
            await h.webhook_peer("tg:42", f"http://{name}:{port}/hook")
            inbox = Inbox()
            async with h.peer("agent:w1") as agent:
                agent.handle("delivery_status", inbox)
                result = await agent.send("tg:42", "tg_reply", {}, message_id="m-1")
                arrived = await inbox.get_type("delivery_status", scaled(10))
            assert result.delivered_to == 0
            assert DeliveryStatus.model_validate(arrived.content).reason == "refused"
            failed = h.rows(message_id="m-1", event="delivery_failed")[0]
            assert failed["status"] == "connect_error" and "not a public address" in failed["error"]
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
    finally:
        listener.close()
