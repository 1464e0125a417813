"""The bus's Prometheus metrics, served by ``GET /metrics`` on the HTTP binding (:mod:`bus.http`).

Nothing here is on the hot path's critical section: the counters are fed by the hooks the bus
already has, and the gauges are computed when Prometheus scrapes.

- :attr:`bus.activity.ActivityLog.on_record` sees every row as it is recorded: ``send_start``
  counts a message, ``rpc_error`` an error by code, ``refused`` and ``taint_refused`` a refusal
  by reason, and the gateway's ``bcp_bits_charged`` rows the bits charged per channel. The
  gateway lives in :mod:`peers`, which the bus never imports; reading its rows is how the bus
  learns what it charged without knowing the gateway. A gateway in another process
  (``bcpbus gateway``) writes to its own log handle, so its bits are not counted here.
- :attr:`bus.activity.ActivityLog.on_commit` times each commit a caller waited for.
- :attr:`bus.server.Bus.on_delivered` gives each delivery's outcome and how long the
  ``processMessage`` call took.
- Peers online, by role and by link, are counted from the routing table at each scrape.

Each bus has its own :class:`prometheus_client.CollectorRegistry`, so several buses in one
process (the tests) never share a counter. What it costs per message: ``bench/README.md``.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from .connection import Connection, Link
from .local import LocalSocket
from .server import Bus

__all__ = ["CONTENT_TYPE", "Metrics", "link_kind"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of :meth:`Metrics.render`: the Prometheus text format, 0.0.4."""

_PROCESS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5)


def link_kind(link: Link) -> str:
    """How the bus reaches a peer: ``websocket``, ``local`` (in-process) or the link's own
    ``kind`` (``webhook``)."""
    if isinstance(link, Connection):
        return "local" if isinstance(link.ws, LocalSocket) else "websocket"
    return str(getattr(link, "kind", "other"))


class Metrics:
    """The metrics of one bus: install with :meth:`attach`, serve :meth:`render`.

    Args:
        bus: the bus to observe; its log's and its own hooks are taken by :meth:`attach`.
    """

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.registry = CollectorRegistry(auto_describe=True)
        """The registry ``GET /metrics`` renders; register more collectors here."""
        r = self.registry
        self.messages = Counter(
            "bcpbus_messages", "Messages the bus accepted (send_start rows)", registry=r
        )
        self.deliveries = Counter(
            "bcpbus_deliveries",
            "processMessage deliveries by outcome (the process_finish status)",
            ["status"],
            registry=r,
        )
        self.errors = Counter(
            "bcpbus_errors",
            "Requests answered with a JSON-RPC error, by code",
            ["code"],
            registry=r,
        )
        self.refusals = Counter(
            "bcpbus_refusals",
            "Requests or deliveries the policy refused, by reason",
            ["reason"],
            registry=r,
        )
        self.rows = Counter(
            "bcpbus_log_rows", "Activity-log rows recorded, by event", ["event"], registry=r
        )
        self.process_seconds = Histogram(
            "bcpbus_process_message_seconds",
            "Time from a processMessage call to its answer (or its failure)",
            buckets=_PROCESS_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "bcpbus_log_commit_seconds",
            "Time a caller waited for the activity log to commit its rows",
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        self.bits = Gauge(
            "bcpbus_bcp_bits_charged",
            "Bits the in-process BCP gateway charged per channel since the bus started, "
            "refunds deducted",
            ["channel"],
            registry=r,
        )
        self.budget_left = Gauge(
            "bcpbus_bcp_budget_left_bits",
            "Bits left in each channel's budget as of its latest charge",
            ["channel"],
            registry=r,
        )
        r.register(_Online(bus))
        self._rows: dict[str, Any] = {}
        self._deliveries: dict[str, Any] = {}

    def attach(self) -> None:
        """Take the bus's and its log's hooks; from now on they feed these metrics."""
        self.bus.log.on_record = self._recorded
        self.bus.log.on_commit = self.commit_seconds.observe
        self.bus.on_delivered = self._delivered

    def detach(self) -> None:
        """Give the hooks back (None): nothing is counted any more."""
        self.bus.log.on_record = None
        self.bus.log.on_commit = None
        self.bus.on_delivered = None

    def render(self) -> bytes:
        """The metrics in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    # Hooks: called on the bus's path, so each is a dict lookup and an increment.

    def _recorded(self, event: str, topic: str | None, status: str | None, payload: Any) -> None:
        child = self._rows.get(event)
        if child is None:
            child = self._rows[event] = self.rows.labels(event)
        child.inc()
        if event == "send_start":
            self.messages.inc()
        elif event == "rpc_error":
            self.errors.labels(status or "").inc()
        elif event == "refused":
            self.refusals.labels(status or "").inc()
        elif event == "taint_refused":
            self.refusals.labels("taint").inc()
        elif event == "bcp_bits_charged" and isinstance(payload, dict):
            self._charged(topic, payload)

    def _charged(self, topic: str | None, payload: dict[str, Any]) -> None:
        channel = str(payload.get("channel") or topic or "")
        bits, left = payload.get("bits"), payload.get("budget_left")
        if isinstance(bits, int | float):
            self.bits.labels(channel).inc(bits)
        if isinstance(left, int | float):
            self.budget_left.labels(channel).set(left)

    def _delivered(self, status: str, seconds: float) -> None:
        child = self._deliveries.get(status)
        if child is None:
            child = self._deliveries[status] = self.deliveries.labels(status)
        child.inc()
        self.process_seconds.observe(seconds)


class _Online(Collector):
    """Peers online by role and by link, counted from the routing table at each scrape."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    def collect(self) -> Iterator[Metric]:
        roles: collections.Counter[str] = collections.Counter()
        links: collections.Counter[str] = collections.Counter()
        for route in self.bus.routes():
            roles.update(route.grants.roles or ("none",))
            links[link_kind(route.handle)] += 1
        by_role = GaugeMetricFamily(
            "bcpbus_connections", "Peers online holding each role", labels=["role"]
        )
        for role, count in sorted(roles.items()):
            by_role.add_metric([role], count)
        by_link = GaugeMetricFamily(
            "bcpbus_peers", "Peers online by how the bus reaches them", labels=["link"]
        )
        for kind, count in sorted(links.items()):
            by_link.add_metric([kind], count)
        yield by_role
        yield by_link

    def describe(self) -> Iterator[Metric]:
        return iter(())
