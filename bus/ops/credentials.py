"""The peers file: which clientIds may connect, the roles it assigns them, and their token hashes.

The operator owns this file; the bus only reads it, and ``bcpbus`` commands that add or rotate
a peer write it back. Tokens are never stored, only their hashes:

.. code-block:: yaml

    version: 1
    peers:
      "agent:main":
        roles: [controller]
        token_hash: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

A peer the bus reaches over HTTP rather than a socket has a ``webhook`` too (``bcpbus peers add
ID --webhook URL``): the URL its ``processMessage`` calls are POSTed to, the secret they are
signed with, and the patterns it is subscribed to from the start (see
:mod:`bus.transports.webhooks`). The
secret is stored as it is, since the bus needs it to sign: the file is written 0600.

.. code-block:: yaml

      "agent:lambda":
        roles: []
        token_hash: "sha256:..."
        webhook:
          url: "https://example.com/bcpbus"
          secret: "whsec_..."
          subscriptions: ["agent:lambda", "system:presence"]

Typical use::

    credentials = Credentials.load(path)        # a missing file is an empty set of peers
    token = credentials.add("agent:main", ["controller"])
    credentials.save(path)                      # hand `token` to the peer; it is shown once
    record = credentials.verify("agent:main", token)   # at each initialize: None means refuse
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, ClassVar, Final
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from schemas import strict_yaml
from schemas.bus import CLIENT_ID_PATTERN

__all__ = [
    "TOKEN_PREFIX",
    "CREDENTIALS_VERSION",
    "Credentials",
    "CredentialsError",
    "PeerRecord",
    "WEBHOOK_SECRET_PREFIX",
    "Webhook",
    "hash_token",
    "validate_webhook_url",
    "validate_client_id",
]

CREDENTIALS_VERSION: Final = 1
"""The only ``version`` this module reads and writes."""

logger = logging.getLogger("bus.ops.credentials")

_CLIENT_ID = re.compile(CLIENT_ID_PATTERN)
_ROLE_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")  # as role names in the policy
_TOKEN_HASH = re.compile(r"sha256:[0-9a-f]{64}")
_HEADER = (
    "# bcpbus peers file: clientIds allowed to connect, their roles and token hashes.\n"
    "# Only hashes of tokens are stored; a lost token cannot be recovered, only replaced.\n"
    "# A webhook secret is stored as it is: the bus signs with it. Keep this file 0600.\n"
)


class CredentialsError(ValueError):
    """The peers file or an argument is malformed; the message names the file and field."""


@dataclass(frozen=True)
class Webhook:
    """Where and how the bus reaches a peer over HTTP (:mod:`bus.transports.webhooks`).

    .. versionadded:: 0.2
    """

    url: str
    """Its ``processMessage`` calls are POSTed here."""
    secret: str = field(repr=False)
    """The HMAC-SHA256 key of ``X-Bcpbus-Signature``; the peer holds it too."""
    subscriptions: tuple[str, ...] = ()
    """Patterns it is subscribed to when the bus starts, beside its own clientId."""


@dataclass(frozen=True)
class PeerRecord:
    """One peer allowed to connect: its clientId, assigned roles and token hash."""

    client_id: str
    roles: tuple[str, ...]
    token_hash: str
    webhook: Webhook | None = None
    """Set for a peer the bus reaches over HTTP."""


def hash_token(token: str) -> str:
    """Return the stored form of ``token``: ``"sha256:<hex>"``.

    Tokens are 256-bit random values from :func:`secrets.token_urlsafe`, so no one can guess
    one from its hash however fast the hash is. Password stretching (bcrypt, scrypt, argon2)
    only protects low-entropy secrets; here it would buy nothing and make every connection
    attempt cost the bus CPU an unauthenticated client could exhaust.
    """
    # surrogatepass: a JSON string can carry a lone surrogate; it must hash, not crash.
    digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
    return f"sha256:{digest}"


def validate_webhook_url(url: str) -> str:
    """Return ``url`` if the bus can POST to it: ``http://`` or ``https://`` with a host.

    Raises:
        CredentialsError: it cannot; the message says what a webhook URL looks like.
    """
    parts = urlsplit(url) if isinstance(url, str) else None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or len(url) > 2048
        or any(ch.isspace() for ch in url)
    ):
        raise CredentialsError(
            f"invalid webhook URL {url!r}: expected http:// or https:// with a host, e.g. "
            "https://example.com/bcpbus"
        )
    return url


def validate_client_id(client_id: str) -> str:
    """Return ``client_id`` if it is a valid clientId, ``prefix:name``.

    Raises:
        CredentialsError: it is not; the message says what a clientId looks like.
    """
    if not isinstance(client_id, str) or _CLIENT_ID.fullmatch(client_id) is None:
        raise CredentialsError(
            f"invalid clientId {client_id!r}: expected prefix:name, a lowercase prefix "
            "(letters, digits, '_', '-'; up to 32) and a name (letters, digits, '.', '_', '-'; "
            "up to 96), e.g. agent:main"
        )
    return client_id


# Compared against when the clientId is unknown, so an unknown id costs the same work as a
# known one and response times don't reveal which ids exist.
TOKEN_PREFIX: Final = "bcpbus_"
"""Every token :meth:`Credentials.add` makes starts with this."""
WEBHOOK_SECRET_PREFIX: Final = "whsec_"
"""Every webhook secret :meth:`Credentials.set_webhook` makes starts with this."""

_DUMMY_HASH: Final = hash_token(secrets.token_urlsafe(32))


class Credentials:
    """The peers allowed to connect. Build it with :meth:`load` or :meth:`empty`."""

    def __init__(self) -> None:
        self._records: dict[str, PeerRecord] = {}
        # token hash -> clientId, for requests that carry only a token (HTTP, bus.transports.http).
        self._by_hash: dict[str, str] = {}
        # Ids added with add_ephemeral: verified like the others, never saved.
        self._ephemeral: set[str] = set()

    @classmethod
    def empty(cls) -> Credentials:
        """Return credentials with no peers: every connection is refused until one is added."""
        return cls()

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Credentials:
        """Read a peers file; a missing file gives empty credentials (a fresh install).

        Raises:
            CredentialsError: the file exists but cannot be read or is malformed; the message
                names the file and the bad field. Refuse to start rather than guess.
        """
        source = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
                mode = os.fstat(f.fileno()).st_mode
        except FileNotFoundError:
            return cls.empty()
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialsError(f"{source}: cannot read the peers file: {exc}") from exc
        if os.name == "posix" and mode & 0o077:
            logger.warning("%s is readable by other users; run: chmod 600 %s", source, source)
        credentials = cls()
        for record in _parse(text, source):
            credentials._store(record)
        return credentials

    def verify(self, client_id: str, token: str | None) -> PeerRecord | None:
        """Return the peer's record if ``token`` proves ``client_id``, else None.

        None covers an unknown clientId, a missing token and a wrong token alike; answer all
        three with the same authentication error. The comparison takes the same time in each
        case (constant-time, against a dummy hash for unknown ids).
        """
        record = self._records.get(client_id)
        expected = record.token_hash if record is not None else _DUMMY_HASH
        presented = hash_token(token if token is not None else "")
        matched = hmac.compare_digest(presented, expected)
        if not matched or record is None or not token:
            return None
        return record

    def identify(self, token: str | None) -> PeerRecord | None:
        """Return the record of the peer ``token`` belongs to, else None.

        For requests that carry a token but no clientId (``Authorization: Bearer`` over HTTP).
        The lookup is by the token's SHA-256: tokens are 256-bit random values, so what the
        lookup's timing could tell about the hash of a guess helps nobody find a token; the
        match itself is then checked in constant time, as :meth:`verify` does.
        """
        if not token:
            return None
        presented = hash_token(token)
        client_id = self._by_hash.get(presented)
        record = self._records.get(client_id) if client_id is not None else None
        if record is None or not hmac.compare_digest(presented, record.token_hash):
            return None
        return record

    def set_webhook(self, client_id: str, url: str, subscriptions: Sequence[str] = ()) -> str:
        """Make ``client_id`` a peer the bus reaches at ``url``; return its new webhook secret.

        The secret signs every POST (``X-Bcpbus-Signature``); give it to the webhook's owner
        with the token. Call :meth:`save` to persist.

        Raises:
            KeyError: ``client_id`` has no record; :meth:`add` it first.
            CredentialsError: ``url`` is not an http(s) URL, or a pattern is not a string.
        """
        record = self._records[client_id]
        validate_webhook_url(url)
        patterns = tuple(_check_pattern(p) for p in subscriptions)
        secret = WEBHOOK_SECRET_PREFIX + secrets.token_urlsafe(32)
        self._store(replace(record, webhook=Webhook(url, secret, patterns)))
        return secret

    def add(self, client_id: str, roles: Sequence[str]) -> str:
        """Create a token for ``client_id`` and return it; only its hash is kept.

        An existing record for the id is replaced, so this is also how a token is rotated: the
        old one stops working. Call :meth:`save` to persist, then give the token to the peer;
        it cannot be shown again.

        Raises:
            CredentialsError: ``client_id`` or a role name is malformed.
        """
        token = self._put(client_id, roles)
        self._ephemeral.discard(client_id)
        return token

    def add_ephemeral(self, client_id: str, roles: Sequence[str]) -> str:
        """Like :meth:`add`, but in memory only: :meth:`save` never writes it.

        For peers the bus runs in its own process (its gateway), whose token lives as long as
        the process.
        """
        token = self._put(client_id, roles)
        self._ephemeral.add(client_id)
        return token

    def reloaded(self, path: str | os.PathLike[str]) -> Credentials:
        """Read the peers file again, keeping this object's ephemeral peers (its gateway).

        Raises:
            CredentialsError: as :meth:`load`; keep using this object.
        """
        fresh = Credentials.load(path)
        for client_id in self._ephemeral:
            fresh._records[client_id] = self._records[client_id]
            fresh._ephemeral.add(client_id)
        return fresh

    def record(self, client_id: str) -> PeerRecord | None:
        """Return ``client_id``'s record, or None if it has none."""
        return self._records.get(client_id)

    def remove(self, client_id: str) -> bool:
        """Forget ``client_id``; return False if it was not there. Call :meth:`save` to persist."""
        self._ephemeral.discard(client_id)
        record = self._records.pop(client_id, None)
        if record is None:
            return False
        self._by_hash.pop(record.token_hash, None)
        return True

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the non-ephemeral peers to ``path`` atomically, readable by the owner only.

        The file is written beside ``path`` and renamed over it, so a reader sees the old file
        or the new one, never half of one.

        Raises:
            OSError: the file could not be written; the old file is left as it was.
        """
        peers = {
            r.client_id: _peer_entry(r)
            for r in self.records()
            if r.client_id not in self._ephemeral
        }
        body = yaml.safe_dump(
            {"version": CREDENTIALS_VERSION, "peers": peers}, sort_keys=False, width=100
        )
        path = os.fspath(path)
        directory, name = os.path.split(path)
        tmp = os.path.join(directory, f".{name}.{secrets.token_hex(6)}.tmp")
        # O_EXCL with 0o600: the file never exists with wider permissions, not even briefly.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(_HEADER + body)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o600)  # exactly 0600, whatever the umask
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def records(self) -> list[PeerRecord]:
        """Return every peer, ephemeral ones included, sorted by clientId."""
        return [self._records[cid] for cid in sorted(self._records)]

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._records

    def __len__(self) -> int:
        return len(self._records)

    def __repr__(self) -> str:
        return f"<Credentials {len(self)} peers>"

    def _put(self, client_id: str, roles: Sequence[str]) -> str:
        validate_client_id(client_id)
        if isinstance(roles, str):
            raise CredentialsError("roles must be a list of role names, not one string")
        for role in roles:
            _check_role(role)
        # The prefix makes a leaked token recognizable (secret scanners match it) and keeps it
        # from starting with "-", which a command line would read as an option.
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        self._store(PeerRecord(client_id, tuple(roles), hash_token(token)))
        return token

    def _store(self, record: PeerRecord) -> None:
        old = self._records.get(record.client_id)
        if old is not None:
            self._by_hash.pop(old.token_hash, None)
        self._records[record.client_id] = record
        self._by_hash[record.token_hash] = record.client_id


def _peer_entry(record: PeerRecord) -> dict[str, Any]:
    entry: dict[str, Any] = {"roles": list(record.roles), "token_hash": record.token_hash}
    if record.webhook is not None:
        entry["webhook"] = {
            "url": record.webhook.url,
            "secret": record.webhook.secret,
            "subscriptions": list(record.webhook.subscriptions),
        }
    return entry


def _check_pattern(pattern: Any) -> str:
    # The bus checks each pattern against the topic grammar and the policy when it subscribes
    # the peer (and logs a refusal); here only the type, so the file stays readable.
    if not isinstance(pattern, str) or not 0 < len(pattern) <= 256:
        raise CredentialsError(
            f"invalid subscription pattern {pattern!r}: expected a topic pattern"
        )
    return pattern


def _check_role(role: Any) -> None:
    if not isinstance(role, str) or _ROLE_NAME.fullmatch(role) is None:
        raise CredentialsError(
            f"invalid role name {role!r}: use lowercase letters, digits, '_', '-'"
        )


# The file's shape; a bad entry is reported with the words of validate_client_id and
# _check_role, so the file and the command line explain a clientId or a role alike.


def _client_id_key(value: Any) -> Any:
    try:
        return validate_client_id(value)
    except CredentialsError as exc:
        strict_yaml.invalid(str(exc))


def _role_name(value: Any) -> Any:
    try:
        _check_role(value)
    except CredentialsError as exc:
        strict_yaml.invalid(str(exc))
    return value


def _token_hash(value: Any) -> Any:
    if not isinstance(value, str) or _TOKEN_HASH.fullmatch(value) is None:
        strict_yaml.invalid("expected sha256: and 64 lowercase hex digits")
    return value


def _expect(kind: type, message: str) -> BeforeValidator:
    def check(value: Any) -> Any:
        if not isinstance(value, kind):
            strict_yaml.invalid(message)
        return value

    return BeforeValidator(check)


def _missing() -> Any:
    # None, validated: a missing key gets the same words as a wrong one, what to write there.
    return Field(default=None, validate_default=True)


def _webhook_url(value: Any) -> Any:
    try:
        return validate_webhook_url(value)
    except CredentialsError as exc:
        strict_yaml.invalid(str(exc))


def _webhook_secret(value: Any) -> Any:
    if not isinstance(value, str) or len(value) < 16:
        strict_yaml.invalid("expected the webhook secret `bcpbus peers add --webhook` printed")
    return value


def _pattern(value: Any) -> Any:
    try:
        return _check_pattern(value)
    except CredentialsError as exc:
        strict_yaml.invalid(str(exc))


class _WebhookFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    url: Annotated[str, BeforeValidator(_webhook_url)] = _missing()
    secret: Annotated[str, BeforeValidator(_webhook_secret)] = _missing()
    subscriptions: Annotated[
        tuple[Annotated[str, BeforeValidator(_pattern)], ...],
        _expect(list, "expected a list of topic patterns ([] for none)"),
    ] = ()


class _PeerFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    roles: Annotated[
        tuple[Annotated[str, BeforeValidator(_role_name)], ...],
        _expect(list, "expected a list of role names ([] for none)"),
    ] = _missing()
    token_hash: Annotated[str, BeforeValidator(_token_hash)] = _missing()
    webhook: _WebhookFile | None = None


class _PeersFile(strict_yaml.VersionedFile):
    VERSION: ClassVar[int] = CREDENTIALS_VERSION
    peers: Annotated[
        dict[Annotated[str, BeforeValidator(_client_id_key)], _PeerFile],
        _expect(dict, "expected a mapping of clientId to {roles, token_hash} ({} for none)"),
    ] = _missing()


def _parse(text: str, source: str) -> Iterator[PeerRecord]:
    try:
        shape = strict_yaml.load_model(_PeersFile, text, source=source)
    except strict_yaml.LoadError as exc:
        raise CredentialsError(str(exc)) from exc
    for client_id, peer in shape.peers.items():
        hook = peer.webhook
        webhook = Webhook(hook.url, hook.secret, hook.subscriptions) if hook is not None else None
        yield PeerRecord(client_id, peer.roles, peer.token_hash, webhook)
