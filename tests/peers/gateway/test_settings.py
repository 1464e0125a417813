"""Tests for peers/gateway/settings.py: the serve config's gateway: section."""

from __future__ import annotations

import pytest

from bus.ops.config import ConfigError
from peers.gateway.settings import GatewaySettings


def test_from_mapping_sets_the_keys_given():
    """Keys of the gateway: section set their fields; the rest keep their defaults."""
    data = {"query_ttl": 5, "enabled": False, "screener_timeout": 2.5}
    settings = GatewaySettings.from_mapping(data, where="f: gateway")
    assert settings == GatewaySettings(query_ttl=5.0, enabled=False, screener_timeout=2.5)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"query_tl": 1}, "f: gateway.query_tl: unknown key; expected one of approval_timeout"),
        ({"max_retries": -1}, "f: gateway.max_retries: must not be negative"),
        ({"max_retries": 1.5}, "f: gateway.max_retries: expected a whole number, got 1.5"),
        ({"query_ttl": None}, "f: gateway.query_ttl: expected a number, got None"),
        ({"enabled": "no"}, "f: gateway.enabled: expected true or false, got 'no'"),
        ({"screener_timeout": -1}, "f: gateway.screener_timeout: must not be negative"),
    ],
)
def test_from_mapping_names_the_bad_key(data, error):
    """A bad gateway: section is a ConfigError naming the file and the key's path."""
    with pytest.raises(ConfigError) as caught:
        GatewaySettings.from_mapping(data, where="f: gateway")
    assert str(caught.value).startswith(error)
