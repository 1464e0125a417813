"""Configuration: the limits value object and the ``bcpbus serve --config`` YAML file.

Every limit has a ``DEFAULT_*`` constant and a key in the config file's ``limits:`` section;
``null`` in YAML (None in Python) turns a limit off where that is safe.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from schemas import strict_yaml

__all__ = [
    "DEFAULT_DEDUP_MAX_IDS",
    "DEFAULT_DEDUP_WINDOW",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_INITIALIZE_TIMEOUT",
    "DEFAULT_MAX_ANONYMOUS_CONNECTIONS",
    "DEFAULT_MAX_ANONYMOUS_PER_ADDRESS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_MAX_INFLIGHT_DELIVERIES",
    "DEFAULT_MAX_INFLIGHT_REQUESTS",
    "DEFAULT_MAX_SUBSCRIPTIONS",
    "DEFAULT_MAX_WRITE_BUFFER",
    "DEFAULT_PROCESS_TIMEOUT",
    "DEFAULT_SHUTDOWN_GRACE",
    "DEFAULT_SLOW_CONSUMER_TIMEOUT",
    "ConfigError",
    "Limits",
    "ServeConfig",
    "read_section",
]

DEFAULT_MAX_FRAME_BYTES = 1 << 20
DEFAULT_MAX_CONNECTIONS = 20_000
DEFAULT_HANDSHAKE_TIMEOUT = 10.0
DEFAULT_INITIALIZE_TIMEOUT = 10.0
DEFAULT_MAX_SUBSCRIPTIONS = 100
DEFAULT_MAX_INFLIGHT_DELIVERIES = 256
DEFAULT_PROCESS_TIMEOUT = 30.0
DEFAULT_MAX_ANONYMOUS_CONNECTIONS = 1_000
DEFAULT_MAX_ANONYMOUS_PER_ADDRESS = 32
DEFAULT_MAX_INFLIGHT_REQUESTS = 256
DEFAULT_MAX_INFLIGHT_BYTES = 256 << 20
DEFAULT_MAX_WRITE_BUFFER = 4 << 20
DEFAULT_SLOW_CONSUMER_TIMEOUT = 10.0
DEFAULT_DEDUP_WINDOW = 300.0
DEFAULT_DEDUP_MAX_IDS = 100_000
DEFAULT_SHUTDOWN_GRACE = 10.0


class ConfigError(ValueError):
    """The config file is unreadable or has a bad key or value; the message names which."""


@dataclass(frozen=True)
class Limits:
    """What one bus allows, each limit with its own clear error and log row when hit."""

    # Limits
    max_frame_bytes: int | None = DEFAULT_MAX_FRAME_BYTES
    """Largest incoming text frame; a larger one closes the connection with 1009."""
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS
    """Authenticated peers; one more ``initialize`` gets -32005 and close 1013. A takeover of a
    connected clientId does not count as one more."""
    max_anonymous_connections: int | None = DEFAULT_MAX_ANONYMOUS_CONNECTIONS
    """Sockets that have not (yet) initialized, counted apart from peers so that they cannot
    lock peers out; the handshake of one more is answered with HTTP 503."""
    max_anonymous_per_address: int | None = DEFAULT_MAX_ANONYMOUS_PER_ADDRESS
    """Sockets not yet initialized from one remote IP address; one more gets HTTP 503."""
    max_subscriptions: int | None = DEFAULT_MAX_SUBSCRIPTIONS
    """Patterns per connection; one more ``subscribe`` gets -32005."""
    max_inflight_deliveries: int | None = DEFAULT_MAX_INFLIGHT_DELIVERIES
    """``processMessage`` calls awaiting one peer's answer; more wait for a slot, within the
    same ``process_timeout``, and count as ``timeout`` if none frees up."""
    max_inflight_requests: int | None = DEFAULT_MAX_INFLIGHT_REQUESTS
    """Requests from one connection being handled at once; past it the bus stops reading that
    socket until one is answered (backpressure: TCP then slows the sender)."""
    max_inflight_bytes: int | None = DEFAULT_MAX_INFLIGHT_BYTES
    """Bytes of request frames being handled, for the whole bus; a request that would go over
    it gets -32005 at once."""
    max_write_buffer: int | None = DEFAULT_MAX_WRITE_BUFFER
    """Bytes written to one peer that it has not read yet; above it deliveries to that peer fail
    at once (status ``slow_consumer``) instead of queueing more."""
    dedup_max_ids: int | None = DEFAULT_DEDUP_MAX_IDS
    """Recent ``(from, messageId)`` pairs remembered to refuse duplicates (-32008)."""
    # Timeouts
    handshake_timeout: float | None = DEFAULT_HANDSHAKE_TIMEOUT
    """Seconds for the WebSocket opening handshake."""
    initialize_timeout: float | None = DEFAULT_INITIALIZE_TIMEOUT
    """Seconds from connect to a successful ``initialize``; then close code 4002."""
    process_timeout: float | None = DEFAULT_PROCESS_TIMEOUT
    """Seconds one peer has to answer one ``processMessage``."""
    slow_consumer_timeout: float | None = DEFAULT_SLOW_CONSUMER_TIMEOUT
    """Seconds the bus may be unable to write to a peer (its unread bytes above the socket's 32
    KiB write limit all along) before it disconnects it with 4004."""
    dedup_window: float | None = DEFAULT_DEDUP_WINDOW
    """Seconds a ``messageId`` is remembered per sender; None turns duplicate refusal off."""
    shutdown_grace: float | None = DEFAULT_SHUTDOWN_GRACE
    """Seconds a closing bus waits for the requests in flight to be answered."""


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``bcpbus serve`` needs; every field has a default that works with no setup."""

    host: str = "127.0.0.1"
    port: int = 8765
    db: Path = Path("bcpbus.db")
    peers_file: Path = Path("bcpbus-peers.yaml")
    policy: Path | None = None
    """None means the packaged default policy."""
    agents_dir: Path | None = None
    """None means ``./agents`` if it exists, else the packaged reference agents."""
    server_id: str | None = None
    limits: Limits = field(default_factory=Limits)
    gateway: Mapping[str, Any] = field(default_factory=dict)
    """The ``gateway:`` section as written: the bus does not run the gateway, so the peers side
    checks it (:meth:`peers.gateway.settings.GatewaySettings.from_mapping`)."""
    source: str = "<config>"
    """Where the config was read from, for error messages about a section checked later."""

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ServeConfig:
        """Read a YAML config file; relative paths in it are relative to the file.

        Raises:
            ConfigError: the file is missing or not YAML, or a key is unknown or has a bad value.
        """
        path = Path(path)
        try:
            data = strict_yaml.load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: cannot read config: {exc}") from exc
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the config must be a mapping of keys to values")
        return cls.from_mapping(data, base=path.parent, source=str(path))

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, base: Path, source: str) -> ServeConfig:
        """Build a config from parsed YAML; see :meth:`load`."""
        config = cls()
        changes: dict[str, Any] = {}
        for key, value in data.items():
            if key == "limits":
                changes[key] = read_section(Limits, value, f"{source}: limits")
            elif key == "gateway":
                if not isinstance(value, dict):
                    raise ConfigError(f"{source}: gateway: must be a mapping")
                changes[key] = value
            elif key in ("db", "peers_file", "policy", "agents_dir"):
                changes[key] = None if value is None else base / str(value)
            elif key in ("host", "server_id"):
                changes[key] = _typed(value, str, f"{source}: {key}")
            elif key == "port":
                changes[key] = _typed(value, int, f"{source}: port")
            else:
                raise ConfigError(f"{source}: unknown key {key!r}")
        return replace(config, source=source, **changes)


def read_section(cls: type[Any], value: Any, where: str) -> Any:
    """Build the frozen dataclass ``cls`` from a config section of non-negative numbers.

    ``null`` turns a limit off; a boolean field takes only ``true`` or ``false``.

    Raises:
        ConfigError: ``value`` is not a mapping, or a key is unknown or has a bad value; the
            message starts with ``where``.
    """
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a mapping")
    known = {f.name: f for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, item in value.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(known)})")
        default = getattr(cls(), key)
        kind = type(default) if default is not None else float
        if item is None:
            if isinstance(default, bool):
                raise ConfigError(f"{where}.{key}: must be true or false")
            kwargs[key] = None
            continue
        if isinstance(item, bool) is not isinstance(default, bool) or not isinstance(
            item, int | float
        ):
            raise ConfigError(f"{where}.{key}: expected a number, got {item!r}")
        if item < 0:
            raise ConfigError(f"{where}.{key}: must not be negative")
        kwargs[key] = kind(item)
    return cls(**kwargs)


def _typed(value: Any, kind: type[Any], where: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(f"{where}: expected {kind.__name__}, got {value!r}")
    return value
