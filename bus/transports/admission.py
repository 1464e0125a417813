"""Which HTTP connections the binding keeps, and how it counts the ones it refuses.

Without a token anyone can open a connection to the HTTP port, and uvicorn on its own never
times out one that has not finished its request headers: a thousand such sockets used every slot
of ``max_connections``, and every real request got 503. So the binding serves HTTP through
:func:`guarded_protocol`, uvicorn's h11 protocol with two rules of its own:

- **Header timeout.** A connection must send a request's headers within ``header_timeout`` of
  its opening or of the end of its last response; else it is closed (an idle keep-alive one
  too). While a request is being handled the clock is off: the body has its own timeout
  (``body_timeout``, enforced where the body is read, in :mod:`bus.transports.http`).
- **Per address.** Connections from one address (one IPv6 /64) that never carried an
  authenticated request are at most ``max_anonymous_per_address``; one more closes the oldest of
  them that is waiting for headers. A real peer's new connection sends its headers at once and
  authenticates, so sockets held open from its own address cannot keep it out.

Refusals of anonymous clients (a bad token, a request that is not HTTP, a connection closed by
these rules) are counted by :class:`bus.ops.refusals.Refusals` and written as one ``http_refused``
row per interval, never one row each: an anonymous client cannot grow the log at will, nor the
process's own log (uvicorn's "Invalid HTTP request received." warning is counted instead).

The rules sit on uvicorn's ``H11Protocol`` (its ``connection_made``, ``data_received``,
``on_response_complete`` and ``cycle``) because ASGI does not see a connection before its
request: tests/bus/test_http_limits.py fails if a uvicorn upgrade moves them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..ops.refusals import address_key

__all__ = ["ConnectionGuard", "Counts", "guarded_protocol"]

logger = logging.getLogger("bus.transports.http")

_INVALID = "Invalid HTTP request received."
"""What uvicorn logs, as a warning, for each request h11 cannot read."""


class _Counted(logging.Filter):
    """Drops uvicorn's line per unreadable request: the guard counts those."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _INVALID


_connections = logging.getLogger("bus.transports.http.connections")
"""The logger of the binding's connections (uvicorn's ``uvicorn.error`` otherwise)."""
_connections.addFilter(_Counted())


class Counts(Protocol):
    """Where a guard counts the connections it closes: :class:`~bus.ops.refusals.Refusals` for
    the bus; any object with this method for a server without an audit log (``bcpbus mcp``)."""

    def count(self, reason: str, address: str) -> None:
        """Count one refusal (``header_timeout``, ``anonymous_cap``, ``bad_request``)."""


class ConnectionGuard:
    """The connections of one HTTP binding not yet trusted: the per-address cap and the
    header timeout (see the module docstring).

    Args:
        refusals: where closed connections are counted.
        per_address: anonymous connections per address; None: no cap.
        header_timeout: seconds to send a request's headers; None: no timeout.
    """

    def __init__(
        self, refusals: Counts, *, per_address: int | None, header_timeout: float | None
    ) -> None:
        self.refusals = refusals
        self.per_address = per_address
        self.header_timeout = header_timeout
        self._anonymous: dict[str, dict[_Guarded, None]] = {}
        """By address key, the connections never authenticated, oldest first."""
        self._by_client: dict[tuple[str, int], _Guarded] = {}

    def opened(self, connection: _Guarded) -> None:
        """Count a new connection; close the oldest anonymous one of its address waiting for
        headers if that address is over the cap (or this one, if none is waiting)."""
        host, port = connection.client or ("unknown", 0)
        self._by_client[host, port] = connection
        group = self._anonymous.setdefault(address_key(host), {})
        group[connection] = None
        if self.per_address is None or len(group) <= self.per_address:
            return
        victim = next((c for c in group if c.waiting()), connection)
        self.refusals.count("anonymous_cap", host)
        victim.drop()

    def closed(self, connection: _Guarded) -> None:
        """Forget a connection that is gone."""
        host, port = connection.client or ("unknown", 0)
        if self._by_client.get((host, port)) is connection:
            del self._by_client[host, port]
        key = address_key(host)
        group = self._anonymous.get(key)
        if group is not None:
            group.pop(connection, None)
            if not group:
                del self._anonymous[key]

    def authenticated(self, host: str, port: int) -> None:
        """The connection from ``host:port`` carried an authenticated request: it no longer
        counts against its address's cap."""
        connection = self._by_client.get((host, port))
        if connection is None:
            return
        group = self._anonymous.get(address_key(host))
        if group is not None:
            group.pop(connection, None)

    def anonymous(self, host: str) -> int:
        """Connections from ``host``'s address never authenticated, now."""
        return len(self._anonymous.get(address_key(host), ()))


class _Guarded(H11Protocol):
    """uvicorn's h11 protocol under a :class:`ConnectionGuard` (see :func:`guarded_protocol`)."""

    guard: ConnectionGuard
    _timer: asyncio.TimerHandle | None = None
    _served = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.logger = _connections
        super().connection_made(transport)
        self.guard.opened(self)
        if not transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.closed(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the headers are in: the request is the app's now

    def on_response_complete(self) -> None:
        self._served += 1
        super().on_response_complete()
        if self.waiting() and not self.transport.is_closing():
            self._arm()

    def send_400_response(self, msg: str) -> None:
        host = self.client[0] if self.client else "unknown"
        self.guard.refusals.count("bad_request", host)
        super().send_400_response(msg)

    def waiting(self) -> bool:
        """Whether no request is being handled: idle, or its next headers not all in."""
        return self.cycle is None or self.cycle.response_complete

    def drop(self) -> None:
        """Close the connection now, whatever it was doing."""
        self._disarm()
        self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        seconds = self.guard.header_timeout
        if seconds is not None:
            self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if not self.waiting():
            self._arm()  # a request is being handled; its body has a timeout of its own
            return
        pending, _ = self.conn.trailing_data
        if pending or not self._served or self.conn.their_state is not h11.IDLE:
            host = self.client[0] if self.client else "unknown"
            self.guard.refusals.count("header_timeout", host)
        self.transport.close()


def guarded_protocol(guard: ConnectionGuard) -> type[H11Protocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) so that ``guard`` rules its
    connections."""
    attributes: dict[str, Any] = {"guard": guard, "__module__": __name__}
    return type("GuardedH11Protocol", (_Guarded,), attributes)
