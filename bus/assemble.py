"""The one way to put a bus together: its activity log opened, the bus started on it.

``bcpbus serve``, the demo and :mod:`peers.testing` all build it here, so a new part of the bus
(or a new order of opening and closing) is written once::

    async with running(db, credentials=creds) as bus:
        print(bus.url)          # the log is bus.log
        ...

On exit the bus closes first (every connection, with the requests in flight answered), then the
log, which flushes what the bus recorded last. The gateway, which lives in :mod:`peers`, is
started beside the bus with ``peers.gateway.runner``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import ssl as _ssl
from collections.abc import AsyncIterator, Mapping

from .core.identities import PeerIdentity
from .core.policy import Policy
from .log.activity import ActivityLog
from .log.checkpoints import (
    Checkpointer,
    SigningKey,
    default_checkpoints_path,
    load_signing_key,
)
from .ops.config import AuditSettings, HttpSettings, Limits, LogContent, Transport
from .ops.credentials import Credentials
from .server import Bus
from .transports.websocket import WebSocketDoor

__all__ = ["HttpListenFailed", "door_for", "running"]


@contextlib.asynccontextmanager
async def running(
    db: str | os.PathLike[str],
    *,
    credentials: Credentials,
    policy: Policy | None = None,
    identities: Mapping[str, PeerIdentity] | None = None,
    limits: Limits | None = None,
    server_id: str | None = None,
    log_content: LogContent = "full",
    audit: AuditSettings | None = None,
    accept_broken_log: bool = False,
    host: str = "127.0.0.1",
    port: int = 0,
    ssl: _ssl.SSLContext | None = None,
    http: HttpSettings | None = None,
    transport: Transport = "websockets",
) -> AsyncIterator[Bus]:
    """Open the activity log at ``db`` and start a bus on ``host:port`` (0: a free port).

    Args:
        policy: the authorization policy; None for the built-in one.
        log_content: ``full`` or ``digest``: what ``send_start`` rows keep of each envelope.
        audit: where the log's head goes and the key that signs its checkpoints (none unless
            ``audit.signing_key`` is set); None for the defaults.
        accept_broken_log: start on a log whose chain shows a change, recording it.
        ssl: serve ``wss://`` with this context (see :func:`bus.ops.tls.server_context`), and
            ``https://`` on the HTTP port with the same one.
        http: the HTTP binding (:mod:`bus.transports.http`), served when its ``port`` is set;
            the bus's :attr:`~bus.server.Bus.http_url` is then its URL.
        transport: what serves WebSocket peers: ``websockets``, or ``picows`` (its extra).

    Raises:
        ChainBroken: the log's chain or triggers show a change (a ``ValueError`` naming the
            first bad row); see ``accept_broken_log``.
        sqlite3.Error: the log cannot be opened at ``db``.
        OSError: ``host:port`` cannot be listened on; :class:`HttpListenFailed` for the HTTP
            port.
        ImportError: ``http.port`` is set and the ``http`` extra is not installed, or
            ``transport`` is ``picows`` and the ``picows`` extra is not.
        ValueError: the signing key is missing, not a key, or readable by others
            (:class:`~bus.log.checkpoints.KeyExposed`).
    """
    door = door_for(transport)
    log = _activity_log(db, audit or AuditSettings(), accept_broken_log)
    options = _BusOptions(credentials, policy, identities, limits, server_id, log_content)
    async with log:  # opened before the bus reads its last epoch; closed after the bus
        async with options.bus(log, door) as bus:
            await bus.start(host, port, ssl=ssl)
            async with _http_binding(bus, http, host, ssl):
                yield bus


@dataclasses.dataclass(frozen=True)
class _BusOptions:
    """What :func:`running` hands the :class:`Bus` itself, as it was given."""

    credentials: Credentials
    policy: Policy | None
    identities: Mapping[str, PeerIdentity] | None
    limits: Limits | None
    server_id: str | None
    log_content: LogContent

    def bus(self, log: ActivityLog, door: type[WebSocketDoor]) -> Bus:
        """A bus on ``log`` behind ``door``, not started (the built-in policy if none)."""
        return Bus(
            policy=self.policy or Policy.default(),
            credentials=self.credentials,
            log=log,
            identities=self.identities,
            limits=self.limits,
            server_id=self.server_id,
            log_content=self.log_content,
            door=door,
        )


def door_for(transport: Transport) -> type[WebSocketDoor]:
    """The door class of ``transport``.

    Raises:
        ImportError: ``picows`` is asked for and its extra is not installed; the message says
            what to install.
    """
    if transport == "websockets":
        return WebSocketDoor
    try:
        from .transports.picows_door import PicowsDoor  # the extra is optional: imported on use
    except ImportError as exc:
        raise ImportError(
            f"--transport picows needs the picows extra ({exc.name} is missing): "
            "pip install 'bcpbus[picows]', or use the default transport (websockets)"
        ) from exc
    return PicowsDoor


def _activity_log(
    db: str | os.PathLike[str], audit: AuditSettings, accept_broken: bool
) -> ActivityLog:
    """The activity log at ``db``, not opened yet, with its checkpoints signed if ``audit``
    names a signing key."""
    checkpoints = None
    if audit.sign and audit.signing_key is not None:
        target = audit.checkpoints or default_checkpoints_path(db)
        key = _signing_key(audit.signing_key, db)
        checkpoints = Checkpointer(key, target, syslog=audit.syslog)
    return ActivityLog(
        db,
        key_file=audit.key_file,
        accept_broken=accept_broken,
        head=audit.head,
        head_every_rows=audit.head_every_rows,
        head_every_seconds=audit.head_every_seconds,
        checkpoints=checkpoints,
    )


@contextlib.asynccontextmanager
async def _http_binding(
    bus: Bus, settings: HttpSettings | None, host: str, ssl: _ssl.SSLContext | None
) -> AsyncIterator[None]:
    """Serve the HTTP binding beside ``bus`` while in the block, when ``settings`` has a port
    (the bus's ``http_url`` and ``http_mount`` are set meanwhile); else nothing."""
    if settings is None or settings.port is None:
        yield
        return
    try:
        from .transports.http import HttpBinding  # noqa: F811 - the extra is optional: imported on use
    except ImportError as exc:
        raise ImportError(
            f"the HTTP binding needs the http extra ({exc.name} is missing): "
            "pip install 'bcpbus[http]'"
        ) from exc
    async with contextlib.AsyncExitStack() as stack:
        try:
            binding = await stack.enter_async_context(
                HttpBinding(bus, settings, host=host, ssl=ssl)
            )
        except OSError as exc:
            raise HttpListenFailed(exc.errno, exc.strerror) from exc
        bus.http_url, bus.http_mount = binding.url, binding.mount
        try:
            yield
        finally:
            bus.http_url, bus.http_mount = None, None


class HttpListenFailed(OSError):
    """The HTTP binding's port cannot be listened on (not the WebSocket port): the command
    line names ``--http-port`` for it."""


def _signing_key(path: str, db: str | os.PathLike[str]) -> SigningKey:
    """The key at ``path``, or a one-line ``ValueError`` saying why it cannot sign."""
    try:
        return load_signing_key(path, db=db)
    except FileNotFoundError:
        raise ValueError(
            f"signing key {path} not found: make one with `bcpbus audit keygen --out {path}`"
        ) from None
