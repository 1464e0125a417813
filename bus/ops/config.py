"""Configuration: the limits value object and the ``bcpbus serve --config`` YAML file.

Every limit has a ``DEFAULT_*`` constant and a key in the config file's ``limits:`` section;
``null`` in YAML (None in Python) turns a limit off where that is safe. The file is read with
:func:`schemas.strict_yaml.load_model`: the dataclasses here are its shape, so an unknown key,
a negative limit or a string where a number belongs is refused with the key's path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from schemas import strict_yaml

# Defined with the digests it names; importable from here, where it always was.
from ..core.digest import LogContent

__all__ = [
    "AuditSettings",
    "ClusterSettings",
    "LogContent",
    "DEFAULT_DEDUP_MAX_IDS",
    "DEFAULT_DEDUP_WINDOW",
    "DEFAULT_HANDSHAKE_TIMEOUT",
    "DEFAULT_INITIALIZE_TIMEOUT",
    "DEFAULT_MAX_ANONYMOUS_CONNECTIONS",
    "DEFAULT_MAX_ANONYMOUS_PER_ADDRESS",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_FETCH_MESSAGES",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_MAX_INFLIGHT_DELIVERIES",
    "DEFAULT_MAX_INFLIGHT_REQUESTS",
    "DEFAULT_MAX_SUBSCRIPTIONS",
    "DEFAULT_MAX_WRITE_BUFFER",
    "DEFAULT_PROCESS_TIMEOUT",
    "DEFAULT_REFUSAL_LOG_INTERVAL",
    "DEFAULT_SHUTDOWN_GRACE",
    "DEFAULT_SLOW_CONSUMER_TIMEOUT",
    "DEFAULT_FRAME_READ_TIMEOUT",
    "DEFAULT_HTTP_BODY_TIMEOUT",
    "DEFAULT_HTTP_HEADER_TIMEOUT",
    "DEFAULT_HTTP_KEEP_ALIVE_TIMEOUT",
    "DEFAULT_HTTP_MAX_ANONYMOUS_PER_ADDRESS",
    "DEFAULT_HTTP_MAX_CONNECTIONS",
    "DEFAULT_HTTP_MAX_HEADER_BYTES",
    "DEFAULT_HTTP_MAX_REQUESTS",
    "DEFAULT_HTTP_REFUSAL_LOG_INTERVAL",
    "DEFAULT_WEBHOOK_MAX_ANSWER_BYTES",
    "DEFAULT_WEBHOOK_ATTEMPTS",
    "DEFAULT_WEBHOOK_BACKOFF",
    "DEFAULT_WEBHOOK_TIMEOUT",
    "ConfigError",
    "Count",
    "HttpSettings",
    "Limits",
    "Seconds",
    "ServeConfig",
    "Transport",
    "read_section",
]

Transport = Literal["websockets", "picows"]
"""The library that serves WebSocket peers (``serve --transport``, ``transport:``)."""

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
DEFAULT_FRAME_READ_TIMEOUT = 30.0
DEFAULT_DEDUP_WINDOW = 300.0
DEFAULT_DEDUP_MAX_IDS = 100_000
DEFAULT_SHUTDOWN_GRACE = 10.0
DEFAULT_MAX_FETCH_MESSAGES = 1_000

DEFAULT_WEBHOOK_TIMEOUT = 5.0
DEFAULT_WEBHOOK_ATTEMPTS = 4
DEFAULT_WEBHOOK_BACKOFF = 0.5
DEFAULT_HTTP_MAX_REQUESTS = 1_000
DEFAULT_HTTP_MAX_CONNECTIONS = 1_000
DEFAULT_HTTP_HEADER_TIMEOUT = 10.0
DEFAULT_HTTP_BODY_TIMEOUT = 10.0
DEFAULT_HTTP_KEEP_ALIVE_TIMEOUT = 5
DEFAULT_HTTP_MAX_HEADER_BYTES = 16 << 10
DEFAULT_HTTP_MAX_ANONYMOUS_PER_ADDRESS = 32
DEFAULT_REFUSAL_LOG_INTERVAL = 10.0
DEFAULT_HTTP_REFUSAL_LOG_INTERVAL = DEFAULT_REFUSAL_LOG_INTERVAL
DEFAULT_WEBHOOK_MAX_ANSWER_BYTES = 64 << 10

_T = TypeVar("_T")

Count = Annotated[StrictInt, Field(ge=0)]
"""A count in a config section: a YAML integer, not negative (not ``1.5``, ``"3"`` or ``true``)."""
Seconds = Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)]
"""A duration in a config section: a finite YAML number of seconds, not negative."""


class ConfigError(ValueError):
    """The config file is unreadable or has a bad key or value; the message names which."""


@dataclass(frozen=True)
class Limits:
    """What one bus allows, each limit with its own clear error and log row when hit."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    # Limits
    max_frame_bytes: Count | None = DEFAULT_MAX_FRAME_BYTES
    """Largest incoming text frame; a larger one closes the connection with 1009."""
    max_connections: Count | None = DEFAULT_MAX_CONNECTIONS
    """Authenticated peers; one more ``initialize`` gets -32005 and close 1013. A takeover of a
    connected clientId does not count as one more."""
    max_anonymous_connections: Count | None = DEFAULT_MAX_ANONYMOUS_CONNECTIONS
    """Sockets that have not (yet) initialized, counted apart from peers so that they cannot
    lock peers out; the handshake of one more is answered with HTTP 503."""
    max_anonymous_per_address: Count | None = DEFAULT_MAX_ANONYMOUS_PER_ADDRESS
    """Sockets not yet initialized from one remote IP address; one more closes the oldest of
    them with 4006 (HTTP 503 if every one has an ``initialize`` under way)."""
    max_subscriptions: Count | None = DEFAULT_MAX_SUBSCRIPTIONS
    """Patterns per connection; one more ``subscribe`` gets -32005."""
    max_inflight_deliveries: Count | None = DEFAULT_MAX_INFLIGHT_DELIVERIES
    """``processMessage`` calls awaiting one peer's answer; more wait for a slot, within the
    same ``process_timeout``, and count as ``timeout`` if none frees up."""
    max_inflight_requests: Count | None = DEFAULT_MAX_INFLIGHT_REQUESTS
    """Requests from one connection being handled at once; past it the bus stops reading that
    socket until one is answered (backpressure: TCP then slows the sender)."""
    max_inflight_bytes: Count | None = DEFAULT_MAX_INFLIGHT_BYTES
    """Size of the request frames being handled, for the whole bus; a request that would go over
    it gets -32005 at once. Frames are counted in UTF-8 bytes, what the bus holds of the message
    each carries (encoded once); one socket per 4 MiB of it may be reading a large frame at once
    (:mod:`bus.transports.intake`)."""
    max_write_buffer: Count | None = DEFAULT_MAX_WRITE_BUFFER
    """Bytes written to one peer that it has not read yet; above it deliveries to that peer fail
    at once (status ``slow_consumer``) instead of queueing more."""
    dedup_max_ids: Count | None = DEFAULT_DEDUP_MAX_IDS
    """Recent ``(from, messageId)`` pairs remembered to refuse duplicates (-32008)."""
    max_fetch_messages: Annotated[StrictInt, Field(ge=1)] = DEFAULT_MAX_FETCH_MESSAGES
    """Messages one ``fetchMessages`` answer holds at most; a larger ``limit`` is cut to it.
    Always on: one answer must fit in memory and in a frame."""
    # Timeouts
    handshake_timeout: Seconds | None = DEFAULT_HANDSHAKE_TIMEOUT
    """Seconds for the WebSocket opening handshake."""
    initialize_timeout: Seconds | None = DEFAULT_INITIALIZE_TIMEOUT
    """Seconds from connect to a successful ``initialize``; then close code 4002."""
    process_timeout: Seconds | None = DEFAULT_PROCESS_TIMEOUT
    """Seconds one peer has to answer one ``processMessage``."""
    slow_consumer_timeout: Seconds | None = DEFAULT_SLOW_CONSUMER_TIMEOUT
    """Seconds the bus may be unable to write to a peer (its unread bytes above the socket's 32
    KiB write limit all along) before it disconnects it with 4004."""
    frame_read_timeout: Seconds | None = DEFAULT_FRAME_READ_TIMEOUT
    """Seconds a socket may hold one of the large-frame slots (:mod:`bus.transports.intake`)
    without its read loop taking a frame; then it is closed with 4007 and the slot freed, so a
    peer that stops in the middle of a large frame cannot keep others' large messages out."""
    dedup_window: Seconds | None = DEFAULT_DEDUP_WINDOW
    """Seconds a ``messageId`` is remembered per sender; None turns duplicate refusal off."""
    shutdown_grace: Seconds | None = DEFAULT_SHUTDOWN_GRACE
    """Seconds a closing bus waits for the requests in flight to be answered."""
    # Logging
    refusal_log_interval: Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)] = (
        DEFAULT_REFUSAL_LOG_INTERVAL
    )
    """Sockets that never initialized are refused (a wrong token, a handshake past the anonymous
    caps, no ``initialize`` in time, errors before it) without a row each: the refusals are
    counted and written as one ``ws_refused`` row per this many seconds, so an anonymous
    client cannot grow the log at will."""


@dataclass(frozen=True)
class AuditSettings:
    """The activity log's chain: where its head is shipped and who signs it (``audit:``)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    key_file: StrictStr | None = None
    """The key of a log an earlier version chained (version 1, an HMAC); None for the
    database's path plus ``.key``. Read only to check such a log before it is chained on."""
    head: StrictStr | None = None
    """Where to append the head (``ID:HASH``) as the log grows: a file, ``-`` for stdout, or
    None for nowhere. Ship it where the database's owner cannot write."""
    head_every_rows: Annotated[StrictInt, Field(ge=1)] = 1000
    """Rows between two heads (and two checkpoints) written."""
    head_every_seconds: Seconds | None = 10.0
    """Most seconds a new head (and checkpoint) waits to be written; None for no timer."""
    signing_key: StrictStr | None = None
    """The Ed25519 key that signs checkpoints (``bcpbus audit keygen``), 0600; None: ``bcpbus
    serve`` uses ``~/.config/bcpbus/signing.key`` (made on first use), and a bus built in
    code signs nothing."""
    checkpoints: StrictStr | None = None
    """Where signed checkpoints are appended; None for the database's path plus
    ``.checkpoints``."""
    syslog: StrictStr | None = None
    """A syslog daemon each checkpoint is sent to as well: ``HOST:PORT`` (UDP) or a Unix socket
    path such as ``/dev/log``; None for none."""
    sign: StrictBool = True
    """Whether ``bcpbus serve`` signs checkpoints at all (``false`` turns them off)."""


@dataclass(frozen=True)
class ClusterSettings:
    """The config file's ``cluster:`` section (``serve --cluster URL --node NAME``): this bus is
    one node of a cluster of buses on NATS (:mod:`bus.transports.cluster`, docs/cluster.md)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    url: Annotated[StrictStr, Field(pattern=r"^(nats|tls)://")] | None = None
    """The NATS server, ``nats://HOST:PORT``; None: a bus on its own."""
    node: Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")] | None = None
    """This node's name, unique in the cluster; None: the host name."""


@dataclass(frozen=True)
class HttpSettings:
    """The HTTP binding (:mod:`bus.transports.http`): where it listens and how webhooks are called.

    The config file's ``http:`` section; ``bcpbus serve --http-port`` sets ``port``.

    .. versionadded:: 0.2
    """

    __pydantic_config__ = ConfigDict(extra="forbid")

    port: Annotated[StrictInt, Field(ge=0, le=65535)] | None = None
    """The HTTP port, beside the WebSocket one; 0 picks a free one; None serves no HTTP."""
    host: StrictStr | None = None
    """The interface; None is the WebSocket's ``host``."""
    # Limits
    max_connections: Count | None = DEFAULT_HTTP_MAX_CONNECTIONS
    """Open HTTP connections (idle keep-alive ones included) and requests being handled, each
    counted by the server; past it a request is answered 503 at once."""
    max_requests: Count | None = DEFAULT_HTTP_MAX_REQUESTS
    """Messages posted over HTTP being accepted or still being delivered; one more is refused
    with 429 (-32005) and a ``limit_exceeded`` row."""
    max_anonymous_per_address: Count | None = DEFAULT_HTTP_MAX_ANONYMOUS_PER_ADDRESS
    """Connections from one address (one IPv6 /64) that never carried an authenticated
    request; past it the oldest of them still waiting for its request headers is closed, so
    that sockets held open by one address cannot lock out a peer from the same address."""
    max_header_bytes: Annotated[StrictInt, Field(ge=1024)] = DEFAULT_HTTP_MAX_HEADER_BYTES
    """Bytes of a request head (request line and headers) held while it is unfinished; past
    them it is answered 400 and the connection closed (h11's ``max_incomplete_event_size``)."""
    # Timeouts
    header_timeout: Seconds | None = DEFAULT_HTTP_HEADER_TIMEOUT
    """Seconds a connection may take to send a request's headers, counted from its opening or
    from the end of its last response; then it is closed (an idle keep-alive one as well)."""
    body_timeout: Seconds | None = DEFAULT_HTTP_BODY_TIMEOUT
    """Seconds a request may take to send its body, authenticated or not; past it the answer
    is 408 (-32600), with a ``limit_exceeded`` row, and the connection is closed."""
    keep_alive_timeout: Annotated[StrictInt, Field(ge=1)] = DEFAULT_HTTP_KEEP_ALIVE_TIMEOUT
    """Whole seconds an idle connection is kept open for the client's next request (at most
    ``header_timeout``)."""
    # Logging
    refusal_log_interval: Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)] = (
        DEFAULT_HTTP_REFUSAL_LOG_INTERVAL
    )
    """Unauthenticated requests and connections refused are counted, and written as one
    ``http_refused`` row per this many seconds (counts by reason and address), never one row
    each: an anonymous client cannot grow the log at will."""
    # Webhooks
    webhook_timeout: Seconds = DEFAULT_WEBHOOK_TIMEOUT
    """Seconds one webhook POST may take, connecting included."""
    webhook_attempts: Annotated[StrictInt, Field(ge=1)] = DEFAULT_WEBHOOK_ATTEMPTS
    """POSTs of one delivery at most: the first and its retries. All of them fit in the
    ``process_timeout`` of the delivery; a retry that would not is not made."""
    webhook_backoff: Seconds = DEFAULT_WEBHOOK_BACKOFF
    """Seconds before the first retry; each further one waits twice as long (up to 8x), each
    spread by up to a fifth so that webhooks are not retried in lockstep."""
    webhook_max_answer_bytes: Count | None = DEFAULT_WEBHOOK_MAX_ANSWER_BYTES
    """Largest webhook answer body read; past it the bus stops reading, closes the connection
    and the delivery fails (``too_large``)."""
    allow_private_webhooks: StrictBool = False
    """Let webhook URLs name loopback, private, link-local or other non-global addresses
    (``10.0.0.0/8``, ``169.254.169.254``, ``::1``...). Off, such a webhook peer is refused
    when the bus starts and such an address is never connected to, whatever DNS says."""


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
    certfile: Path | None = None
    """TLS certificate chain (PEM): with :attr:`keyfile`, the bus serves ``wss://``."""
    keyfile: Path | None = None
    """The private key of :attr:`certfile` (PEM)."""
    server_id: str | None = None
    transport: Transport = "websockets"
    """What serves WebSocket peers: ``websockets`` (the reference) or ``picows`` (the ``picows``
    extra, compiled frame parsing: docs/operators.md)."""
    log_content: LogContent = "full"
    """What ``send_start`` rows keep of each envelope: ``full`` (all of it) or ``digest`` (its
    type and the SHA-256 of its canonical JSON, for deployments that must not keep content)."""
    limits: Limits = field(default_factory=Limits)
    audit: AuditSettings = field(default_factory=AuditSettings)
    accept_broken_log: bool = False
    """Start on a log whose chain or triggers show a change, recording it and starting a new
    chain segment (``serve --accept-broken-log``; not a config file key, on purpose)."""
    http: HttpSettings = field(default_factory=HttpSettings)
    """The HTTP binding; off unless ``http.port`` is set."""
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    """The cluster this bus is a node of; none unless ``cluster.url`` is set."""
    gateway: Mapping[str, Any] = field(default_factory=dict)
    """The ``gateway:`` section as written: the bus does not run the gateway, so the peers side
    checks it (:meth:`peers.gateway.settings.GatewaySettings.from_mapping`)."""
    source: str = "<config>"
    """Where the config was read from, for error messages about a section checked later."""

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ServeConfig:
        """Read a YAML config file; relative paths in it are relative to the file.

        Raises:
            ConfigError: the file is missing or not YAML, or a key is unknown or has a bad value;
                the message names the file and the key's path.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read config: {exc}") from exc
        try:
            data = strict_yaml.load_model(_ConfigFile, text, source=str(path), empty={})
        except strict_yaml.LoadError as exc:
            raise ConfigError(str(exc)) from exc
        return data.to_config(base=path.parent, source=str(path))

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, base: Path, source: str) -> ServeConfig:
        """Build a config from parsed YAML; see :meth:`load`."""
        try:
            checked = strict_yaml.validate(_ConfigFile, data, source=source)
        except strict_yaml.LoadError as exc:
            raise ConfigError(str(exc)) from exc
        return checked.to_config(base=base, source=source)


class _ConfigFile(BaseModel):
    """The keys a config file may set, each the :class:`ServeConfig` field of its name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: StrictStr = ServeConfig.host
    port: Annotated[StrictInt, Field(ge=0, le=65535)] = ServeConfig.port
    db: StrictStr = str(ServeConfig.db)
    peers_file: StrictStr = str(ServeConfig.peers_file)
    policy: StrictStr | None = None
    agents_dir: StrictStr | None = None
    certfile: StrictStr | None = None
    keyfile: StrictStr | None = None
    server_id: StrictStr | None = None
    log_content: LogContent = ServeConfig.log_content
    transport: Transport = ServeConfig.transport
    limits: Limits = Field(default_factory=Limits)
    audit: AuditSettings = Field(default_factory=AuditSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    gateway: dict[StrictStr, Any] = Field(default_factory=dict)

    def to_config(self, *, base: Path, source: str) -> ServeConfig:
        """Return the defaults changed by the keys the file sets, its paths made absolute."""
        changes = {key: getattr(self, key) for key in self.model_fields_set}
        for key in ("db", "peers_file", "policy", "agents_dir", "certfile", "keyfile"):
            if changes.get(key) is not None:
                changes[key] = base / changes[key]
        audit = changes.get("audit")
        if audit is not None:
            key_file = audit.key_file and str(base / audit.key_file)
            head = audit.head if audit.head in (None, "-") else str(base / audit.head)
            signing_key = audit.signing_key and str(base / audit.signing_key)
            checkpoints = audit.checkpoints and str(base / audit.checkpoints)
            changes["audit"] = replace(
                audit,
                key_file=key_file,
                head=head,
                signing_key=signing_key,
                checkpoints=checkpoints,
            )
        return replace(ServeConfig(), source=source, **changes)


def read_section(cls: type[_T], value: Any, where: str) -> _T:
    """Build ``cls`` from one section of the config file, such as ``gateway:``.

    ``cls`` is a dataclass with ``__pydantic_config__ = ConfigDict(extra="forbid")``, as
    :class:`Limits` is; its annotations say what each key takes (``null`` turns a limit off
    only where the field allows None).

    Args:
        cls: the section's dataclass.
        value: the section as YAML gave it.
        where: the file and the section, such as ``bcpbus.yaml: gateway``.

    Raises:
        ConfigError: ``value`` is not a mapping, or a key is unknown or has a bad value; the
            message starts with ``where`` and goes on with the key's path.
    """
    try:
        return strict_yaml.validate(cls, value, source=where)
    except strict_yaml.LoadError as exc:
        at = f"{where}.{exc.path}" if exc.path else where
        raise ConfigError(f"{at}: {exc.message}") from exc
