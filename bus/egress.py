"""Where the bus may send its webhook POSTs: public addresses only, unless the operator says.

A webhook URL is written by whoever set up the peer, and the host it names resolves through DNS
that the peer's owner may control. Left alone, a URL naming ``169.254.169.254`` (a cloud's
metadata service), ``127.0.0.1:6379`` or a name that resolves to ``10.0.0.5`` would have the bus
POST into the network it runs in. So, unless ``http.allow_private_webhooks`` is set:

- at start, a webhook whose URL names a non-public IP address or ``localhost`` is not attached
  (:func:`private_host`), with an ``auth_failed`` row (status ``private_webhook``);
- at every connection, the name is resolved here and each address checked before connecting
  (:class:`PublicOnly`), so a name that resolves to a private address, now or after a DNS
  change, fails the attempt as a connection error (``refused`` in ``delivery_status``).

"Public" is :attr:`ipaddress.IPv4Address.is_global` and not multicast: loopback, private
(RFC 1918, ``fc00::/7``), link-local, shared (``100.64.0.0/10``), reserved and unspecified
addresses are all refused; an IPv4-mapped IPv6 address is judged as its IPv4 address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import httpcore

__all__ = ["PublicOnly", "is_public", "private_host"]


def is_public(address: str) -> bool:
    """Whether the bus may connect to IP ``address`` without the operator's opt-in."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def private_host(url: str) -> str | None:
    """The host of ``url`` if it is an IP address that is not public, or ``localhost``.

    A name is not resolved here (start must not wait on DNS): :class:`PublicOnly` checks what
    it resolves to at each connection.
    """
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if is_public(host) else host


class PublicOnly(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that connects to public addresses only.

    It resolves the host itself, refuses if any address it resolves to is not public (a name
    with one private address among public ones could be steered to it), and connects to the
    first: the address checked is the address connected to. TLS still verifies the name.

    Args:
        inner: the backend that makes the connections (httpcore's default).
    """

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Resolve ``host``, check every address, connect to the first.

        Raises:
            httpcore.ConnectError: it does not resolve, or resolves to a non-public address.
        """
        try:
            async with asyncio.timeout(timeout):
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
        except (OSError, TimeoutError) as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        addresses = [str(info[4][0]) for info in infos]
        refused = [address for address in addresses if not is_public(address)]
        if not addresses or refused:
            raise httpcore.ConnectError(
                f"{host} resolves to {', '.join(refused) or 'nothing'}, not a public address "
                "(set http.allow_private_webhooks to allow it)"
            )
        return await self._inner.connect_tcp(
            addresses[0], port, timeout, local_address, socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        """Never: a webhook is a URL."""
        raise httpcore.ConnectError("webhooks are not called over Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)
