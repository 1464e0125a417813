"""Where the bus may send its webhook POSTs: public addresses only, unless the operator says.

A webhook URL is written by whoever set up the peer, and the host it names resolves through DNS
that the peer's owner may control. Left alone, a URL naming ``169.254.169.254`` (a cloud's
metadata service), ``127.0.0.1:6379`` or a name that resolves to ``10.0.0.5`` would have the bus
POST into the network it runs in. So, unless ``http.allow_private_webhooks`` is set:

- at start, a webhook whose URL names a non-public IP address or ``localhost`` is not attached
  (:func:`private_host`), with an ``auth_failed`` row (status ``private_webhook``);
- at every connection, the name is resolved by the bus and each address checked before
  connecting (:func:`refusal`, in :class:`bus.transports.webhooks.PublicOnly`), so a name that
  resolves to a private address, now or after a DNS change, fails the attempt as a connection error
  (``refused`` in ``delivery_status``);
- ``bcpbus peers add --webhook`` refuses such a URL unless given ``--allow-private-webhook``.

This module is pure (no I/O, no HTTP library), so the CLI checks a URL without the ``http``
extra.

"Public" is :attr:`ipaddress.IPv4Address.is_global` and not multicast: loopback, private
(RFC 1918, ``fc00::/7``), link-local, shared (``100.64.0.0/10``), reserved and unspecified
addresses are all refused; an IPv4-mapped IPv6 address is judged as its IPv4 address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = ["is_public", "private_host", "refusal"]


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

    A name is not resolved here (start must not wait on DNS): what it resolves to is checked at
    each connection (:func:`refusal`).
    """
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return None
    return None if is_public(host) else host


def refusal(host: str, addresses: Sequence[str]) -> str | None:
    """Why ``host``, resolved to ``addresses``, may not be connected to; None if it may.

    One non-public address among public ones refuses them all: the resolver or the peer could
    steer the connection to it.
    """
    refused = [address for address in addresses if not is_public(address)]
    if addresses and not refused:
        return None
    return (
        f"{host} resolves to {', '.join(refused) or 'nothing'}, not a public address "
        "(set http.allow_private_webhooks to allow it)"
    )
