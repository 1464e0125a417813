"""The bus's Prometheus metrics, served by ``GET /metrics`` on the HTTP binding
(:mod:`bus.transports.http`).

The hooks the bus already has feed plain counters, and the Prometheus families are built from
them (and from the routing table) when Prometheus scrapes.

- :attr:`bus.log.activity.ActivityLog.on_record` sees every row as it is recorded: ``send_start``
  counts a message, ``rpc_error`` an error by code, ``refused`` and ``taint_refused`` a refusal
  by reason, and the gateway's ``bcp_bits_charged`` rows the bits charged per channel. The
  gateway lives in :mod:`peers`, which the bus never imports; reading its rows is how the bus
  learns what it charged without knowing the gateway. A gateway in another process
  (``bcpbus gateway``) writes to its own log handle, so its bits are not counted here.
- :attr:`bus.log.activity.ActivityLog.on_commit` times each commit a caller waited for.
- :attr:`bus.server.Bus.on_delivered` gives each delivery's outcome and how long the
  ``processMessage`` call took.
- Peers online, by role and by link, are counted from the routing table at each scrape.

Each bus has its own :class:`prometheus_client.CollectorRegistry`, so several buses in one
process (the tests) never share a counter. What it costs per message: ``bench/README.md``.
"""

from __future__ import annotations

import bisect
import collections
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from ..core.router import Route
from ..log.activity import ActivityLog
from .refusals import Refusals

__all__ = ["CONTENT_TYPE", "Metrics", "Observed", "link_kind"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of :meth:`Metrics.render`: the Prometheus text format, 0.0.4."""

_PROCESS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 5)


def link_kind(link: object) -> str:
    """How the bus reaches a peer: its link's ``kind`` (``websocket``, ``local`` for
    in-process, ``webhook``)."""
    return str(getattr(link, "kind", "other"))


class Observed(Protocol):
    """What the metrics read of a bus (:class:`bus.server.Bus`): its log and refusal counts,
    its routing table, and the hook it tells each delivery's outcome."""

    log: ActivityLog
    refusals: Refusals
    on_delivered: Callable[[str, float], None] | None

    def routes(self) -> Iterable[Route[Any]]: ...


class Metrics:
    """The metrics of one bus: install with :meth:`attach`, serve :meth:`render`.

    The hooks only add to plain ints and floats (a dictionary lookup and an addition each,
    under a microsecond); the Prometheus families are built from them when scraped. Going
    through prometheus_client's own counters and histograms on every row cost 23-35 µs per
    message (4 rows, a delivery, 2 commit waits), their locks and bucket loops included.

    Args:
        bus: the bus to observe; its log's and its own hooks are taken by :meth:`attach`.
    """

    def __init__(self, bus: Observed) -> None:
        self.bus = bus
        self.registry = CollectorRegistry(auto_describe=True)
        """The registry ``GET /metrics`` renders; register more collectors here."""
        self.rows: collections.Counter[str] = collections.Counter()
        """Activity-log rows recorded, by event."""
        self.deliveries: collections.Counter[str] = collections.Counter()
        """Deliveries by ``process_finish`` status."""
        self.errors: collections.Counter[str] = collections.Counter()
        """``rpc_error`` rows by JSON-RPC code."""
        self.refusals: collections.Counter[str] = collections.Counter()
        """Refusals by reason (``taint`` for ``taint_refused``)."""
        self.http_refused: collections.Counter[str] = collections.Counter()
        """Anonymous HTTP requests and connections refused, by reason: the HTTP binding counts
        them here as they happen (its log rows are one per interval)."""
        self.bits: dict[str, float] = {}
        """Bits charged per BCP channel, refunds deducted."""
        self.budget_left: dict[str, float] = {}
        """Budget left per BCP channel as of its latest charge."""
        self.process_seconds = _Histogram(_PROCESS_BUCKETS)
        self.commit_seconds = _Histogram(_COMMIT_BUCKETS)
        self.registry.register(_Families(self))
        self.registry.register(_Online(bus))

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

    # Hooks: called on the bus's path.

    def _recorded(self, event: str, topic: str | None, status: str | None, payload: Any) -> None:
        self.rows[event] += 1
        if event in _PLAIN:
            return
        if event == "rpc_error":
            self.errors[status or ""] += 1
        elif event == "refused":
            self.refusals[status or ""] += 1
        elif event == "taint_refused":
            self.refusals["taint"] += 1
        elif event == "bcp_bits_charged" and isinstance(payload, dict):
            self._charged(topic, payload)

    def _charged(self, topic: str | None, payload: dict[str, Any]) -> None:
        channel = str(payload.get("channel") or topic or "")
        bits, left = payload.get("bits"), payload.get("budget_left")
        if isinstance(bits, int | float):
            self.bits[channel] = self.bits.get(channel, 0.0) + bits
        if isinstance(left, int | float):
            self.budget_left[channel] = left

    def _delivered(self, status: str, seconds: float) -> None:
        self.deliveries[status] += 1
        self.process_seconds.observe(seconds)


_PLAIN = frozenset({"send_start", "send_finish", "process_start", "process_finish"})
"""The rows of every message: counted by event and nothing more."""


class _Histogram:
    """Counts per bucket and a sum, turned into a Prometheus histogram when scraped."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if math.isinf(bound) else str(float(bound)), cumulative))
        return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=self.total)


class _Families(Collector):
    """The counters, gauges and histograms of :class:`Metrics`, built at each scrape."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        messages = CounterMetricFamily(
            "bcpbus_messages", "Messages the bus accepted (send_start rows)"
        )
        messages.add_metric([], m.rows["send_start"])
        yield messages
        yield _counter(
            "bcpbus_deliveries",
            "processMessage deliveries by outcome (the process_finish status)",
            "status",
            m.deliveries,
        )
        yield _counter(
            "bcpbus_errors", "Requests answered with a JSON-RPC error, by code", "code", m.errors
        )
        yield _counter(
            "bcpbus_refusals",
            "Requests or deliveries the policy refused, by reason",
            "reason",
            m.refusals,
        )
        yield _counter(
            "bcpbus_http_refused",
            "Anonymous HTTP requests and connections refused, by reason",
            "reason",
            m.http_refused,
        )
        yield _counter(
            "bcpbus_ws_refused",
            "WebSocket sockets that never initialized, refused, by reason",
            "reason",
            m.bus.refusals.total,
        )
        yield _counter("bcpbus_log_rows", "Activity-log rows recorded, by event", "event", m.rows)
        yield from self._timings()
        yield from self._budgets()

    def _timings(self) -> Iterator[Metric]:
        """How long deliveries and log commits took, as histograms."""
        m = self.metrics
        yield m.process_seconds.family(
            "bcpbus_process_message_seconds",
            "Time from a processMessage call to its answer (or its failure)",
        )
        yield m.commit_seconds.family(
            "bcpbus_log_commit_seconds",
            "Time a caller waited for the activity log to commit its rows",
        )

    def _budgets(self) -> Iterator[Metric]:
        """The in-process BCP gateway's bits per channel: charged, and left."""
        m = self.metrics
        yield _gauge(
            "bcpbus_bcp_bits_charged",
            "Bits the in-process BCP gateway charged per channel since the bus started, "
            "refunds deducted",
            "channel",
            m.bits,
        )
        yield _gauge(
            "bcpbus_bcp_budget_left_bits",
            "Bits left in each channel's budget as of its latest charge",
            "channel",
            m.budget_left,
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _counter(
    name: str, documentation: str, label: str, values: Mapping[str, float]
) -> CounterMetricFamily:
    return _labelled(CounterMetricFamily(name, documentation, labels=[label]), values)


def _gauge(
    name: str, documentation: str, label: str, values: Mapping[str, float]
) -> GaugeMetricFamily:
    return _labelled(GaugeMetricFamily(name, documentation, labels=[label]), values)


_Family = TypeVar("_Family", CounterMetricFamily, GaugeMetricFamily)


def _labelled(family: _Family, values: Mapping[str, float]) -> _Family:
    """``family`` with one sample per label value, in a stable order."""
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class _Online(Collector):
    """Peers online by role and by link, counted from the routing table at each scrape."""

    def __init__(self, bus: Observed) -> None:
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
