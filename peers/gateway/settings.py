"""How the BCP gateway runs: :class:`GatewaySettings`, from the serve config's ``gateway:``.

The bus's config file (:class:`bus.config.ServeConfig`) keeps the ``gateway:`` section as a raw
mapping, since the bus knows nothing of the gateway; :meth:`GatewaySettings.from_mapping`
checks it with the same rules as the ``limits:`` section.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bus.config import read_section

__all__ = ["GatewaySettings"]


@dataclass(frozen=True)
class GatewaySettings:
    """How the BCP gateway runs (``bcpbus serve``, ``bcpbus gateway``)."""

    enabled: bool = True
    """Whether ``bcpbus serve`` starts the gateway beside the bus."""
    query_ttl: float = 300.0
    """Seconds a query may wait for a valid answer before it fails with ``timeout``."""
    max_retries: int = 2
    """Invalid answers a reader may send for one query before ``retries_exhausted``."""
    approval_timeout: float = 600.0
    """Seconds a human has to decide an approval; then it counts as rejected."""
    outbox_ttl: float = 3600.0
    """Seconds a subscription push waits for an offline controller before it expires."""

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, where: str) -> GatewaySettings:
        """Build the settings from the serve config's ``gateway:`` section.

        Raises:
            ConfigError: a key is unknown or has a bad value; the message starts with ``where``.
        """
        settings: GatewaySettings = read_section(cls, data, where)
        return settings
