"""How the BCP gateway runs: :class:`GatewaySettings`, from the serve config's ``gateway:``.

The bus's config file (:class:`bus.ops.config.ServeConfig`) keeps the ``gateway:`` section as a raw
mapping, since the bus knows nothing of the gateway; :meth:`GatewaySettings.from_mapping`
checks it with :func:`bus.ops.config.read_section`, the loader of the ``limits:`` section: the
annotations below are the section's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, StrictBool

from bus.ops.config import Count, Seconds, read_section

__all__ = ["GatewaySettings"]


@dataclass(frozen=True)
class GatewaySettings:
    """How the BCP gateway runs (``bcpbus serve``, ``bcpbus gateway``)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    enabled: StrictBool = True
    """Whether ``bcpbus serve`` starts the gateway beside the bus."""
    query_ttl: Seconds = 300.0
    """Seconds a query may wait for a valid answer before it fails with ``timeout``."""
    max_retries: Count = 2
    """Invalid answers a reader may send for one query before ``retries_exhausted``."""
    approval_timeout: Seconds = 600.0
    """Seconds a human has to decide an approval; then it counts as rejected."""
    outbox_ttl: Seconds = 3600.0
    """Seconds a subscription push waits for an offline controller before it expires."""
    screener_timeout: Seconds = 10.0
    """Seconds the gateway waits for the verdicts of a channel's screeners; a screener that has
    not answered by then failed, and the channel's ``screener_failure`` decides."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str) -> GatewaySettings:
        """Build the settings from the serve config's ``gateway:`` section.

        Raises:
            ConfigError: a key is unknown or has a bad value; the message starts with ``where``.
        """
        return read_section(cls, data, where)
