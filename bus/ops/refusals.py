"""Refusals of clients that never authenticated: counted, and logged as one row per interval.

Anyone can open a socket to the bus's ports without a token. If each refusal (a wrong token, a
handshake past the anonymous cap, an ``initialize`` that never came) wrote a row of its own, an
anonymous client could grow the audit log at will. So transports count such refusals here, by
reason and address, and :class:`Refusals` writes what it counted as one summary row per
interval (and one more when its owner stops): the WebSocket port's ``ws_refused`` rows
(:mod:`bus.server`), the HTTP binding's ``http_refused`` rows (:mod:`bus.transports.http`). Peers
that authenticated keep their rows, one per event.

A row lists the :data:`MAX_LISTED` busiest (reason, address) pairs and sums the others, so a
client spreading over many addresses cannot grow one row either.
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress

from schemas.common import BUS_CLIENT_ID

from ..core.logevents import LogEvent
from ..log.activity import ActivityLog

__all__ = ["MAX_LISTED", "Refusals", "address_key"]

MAX_LISTED = 20
"""Addresses one summary row lists by name; the rest are summed as ``others``."""


def address_key(host: str) -> str:
    """What refusals and per-address caps count by: the IPv4 address, or the IPv6 /64 (one
    host gets a whole /64 and could otherwise spread over it)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else ip)


class Refusals:
    """Refusals of anonymous clients, counted, and logged as one ``event`` row per interval.

    Args:
        log: where the summary rows go.
        interval: seconds between two rows (one row per interval at most).
        total: a counter to add each refusal to by reason, as it happens (the metrics').
        event: the summary rows' event (``http_refused``, ``ws_refused``).
    """

    def __init__(
        self,
        log: ActivityLog,
        interval: float,
        total: collections.Counter[str] | None = None,
        *,
        event: LogEvent = LogEvent.HTTP_REFUSED,
    ) -> None:
        self.log = log
        self.interval = interval
        self.event = event
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.total: collections.Counter[str] = total if total is not None else collections.Counter()
        """Refusals by reason since the transport started."""

    def count(self, reason: str, address: str) -> None:
        """Count one refusal: ``reason`` is a code (``unknown_token``, ``initialize_timeout``...,
        listed in docs/http.md and docs/protocol.md), ``address`` the client's IP."""
        self._counts[reason, address_key(address)] += 1
        self.total[reason] += 1

    def flush(self) -> None:
        """Record what was counted since the last row as one row, if any: status
        ``aggregate``, payload ``{seconds, total, reasons, addresses, others}``."""
        if not self._counts:
            return
        counts, self._counts = self._counts, collections.Counter()
        reasons: collections.Counter[str] = collections.Counter()
        for (reason, _), number in counts.items():
            reasons[reason] += number
        listed = counts.most_common(MAX_LISTED)
        total = sum(counts.values())
        self.log.record(
            self.event,
            actor=BUS_CLIENT_ID,
            status="aggregate",
            payload={
                "seconds": self.interval,
                "total": total,
                "reasons": dict(sorted(reasons.items())),
                "addresses": [
                    {"address": address, "reason": reason, "count": number}
                    for (reason, address), number in listed
                ],
                "others": total - sum(number for _, number in listed),
            },
        )

    async def run(self) -> None:
        """Flush every ``interval`` seconds, forever; cancel the task and :meth:`flush` once
        more to stop."""
        while True:
            await asyncio.sleep(self.interval)
            self.flush()
