"""Signed checkpoints of the activity log: the head, signed with Ed25519, kept outside the database.

A checkpoint is a C2SP checkpoint (https://c2sp.org/tlog-checkpoint) in a C2SP signed note
(https://c2sp.org/signed-note), the text transparency-log tooling reads::

    bcpbus.example/activity-log        origin: the signing key's name
    48213                              tree size: the id of the row it signs
    nwzG7T...=                         root hash: that row's chain (32 bytes), base64
                                       a blank line, then one signature line:
    — bcpbus.example/activity-log AbCd...=    base64(key id (4 bytes) || Ed25519 signature)

The key id is the first 4 bytes of SHA-256(name, a newline, the signature type 0x01, the 32-byte
public key), as the signed-note spec recommends; the public key is shared as a verifier key
``NAME+KEYID+BASE64(0x01 || public key)`` and the private key is kept as ``PRIVATE+KEY+NAME+KEYID+
BASE64(0x01 || seed)``, the forms Go's ``golang.org/x/mod/sumdb/note`` reads. The "tree" is the
hash chain of :mod:`bus.log.chain`, not a Merkle tree: a checkpoint signs the chain up to its row,
which vouches for every row before it, and a consistency proof between two checkpoints is the
rows between them.

Why Ed25519 signatures: they make the log checkable by anyone who holds the public key, and
forgeable by no one who does not hold the private key, which never needs to leave the bus's
host (``bcpbus audit keygen``); an HMAC could offer only one of the two. :class:`Checkpointer`
appends them to a file (``<db>.checkpoints`` by default) as the log grows and at shutdown, and
:func:`check` holds them against the rows: a row changed since, a cut tail or a replaced log
shows as a checkpoint the rows no longer match.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import logging
import os
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .chain import Head

__all__ = [
    "Checkpoint",
    "Checkpointer",
    "Findings",
    "KeyExposed",
    "SYSLOG_MARKER",
    "Note",
    "SigningKey",
    "VerifierKey",
    "check",
    "create_signing_key",
    "default_checkpoints_path",
    "load_signing_key",
    "load_verifier_key",
    "read_notes",
]

logger = logging.getLogger("bus.log.activity")

ED25519 = 0x01
"""The signed-note signature type of Ed25519."""

SIGNATURE_PREFIX = "\u2014 "
"""What starts a signature line: an em dash and a space."""


class KeyExposed(ValueError):
    """The signing key's file may be read or written by others: ``chmod 600`` it."""


def default_checkpoints_path(db: str | os.PathLike[str]) -> Path:
    """Where checkpoints go when no file is given: ``<db>.checkpoints`` beside the database."""
    db = Path(db)
    return db.with_name(db.name + ".checkpoints")


def _key_id(name: str, public: bytes) -> bytes:
    return hashlib.sha256(name.encode() + b"\n" + bytes([ED25519]) + public).digest()[:4]


def _check_name(name: str) -> str:
    # signed-note: a name is non-empty UTF-8 with no Unicode spaces and no plus sign.
    if not name or "+" in name or any(ch.isspace() for ch in name):
        raise ValueError(f"{name!r} is not a key name: no spaces and no '+' (e.g. host/bcpbus)")
    return name


@dataclass(frozen=True)
class VerifierKey:
    """A public key that checks checkpoints: what an auditor holds."""

    name: str
    key_id: bytes
    public: Ed25519PublicKey

    @classmethod
    def from_text(cls, text: str) -> VerifierKey:
        """Read ``NAME+KEYID+BASE64`` (the line ``bcpbus audit keygen`` writes to ``.pub``).

        Raises:
            ValueError: ``text`` is not such a key, or its key id does not match it.
        """
        # A name holds no "+", and base64 may: split from the left.
        name, _, rest = text.strip().partition("+")
        hex_id, _, rest = rest.partition("+")
        try:
            raw = base64.b64decode(rest, validate=True)
            key_id = bytes.fromhex(hex_id)
        except (binascii.Error, ValueError):
            raw, key_id = b"", b""
        if len(raw) != 33 or raw[0] != ED25519 or len(key_id) != 4:
            raise ValueError("not a verifier key: give the NAME+KEYID+KEY line of the .pub file")
        _check_name(name)
        if _key_id(name, raw[1:]) != key_id:
            raise ValueError(f"verifier key {name}: its key id does not match its key")
        return cls(name, key_id, Ed25519PublicKey.from_public_bytes(raw[1:]))

    def to_text(self) -> str:
        raw = bytes([ED25519]) + self.public.public_bytes_raw()
        return f"{self.name}+{self.key_id.hex()}+{base64.b64encode(raw).decode()}"

    def verify(self, text: str, signature: bytes) -> bool:
        """Whether ``signature`` (without its key id) signs ``text``."""
        try:
            self.public.verify(signature, text.encode())
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class SigningKey:
    """The private key the bus signs checkpoints with."""

    name: str
    private: Ed25519PrivateKey

    @classmethod
    def generate(cls, name: str) -> SigningKey:
        """A new random key called ``name`` (the checkpoints' origin line)."""
        return cls(_check_name(name), Ed25519PrivateKey.generate())

    @classmethod
    def from_text(cls, text: str) -> SigningKey:
        """Read ``PRIVATE+KEY+NAME+KEYID+BASE64``.

        Raises:
            ValueError: ``text`` is not such a key.
        """
        prefix, _, rest = text.strip().partition("+KEY+")
        name, _, rest = rest.partition("+")
        hex_id, _, rest = rest.partition("+")
        try:
            raw = base64.b64decode(rest, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if prefix != "PRIVATE" or len(raw) != 33 or raw[0] != ED25519:
            raise ValueError("not a signing key: make one with `bcpbus audit keygen --out PATH`")
        key = cls(_check_name(name), Ed25519PrivateKey.from_private_bytes(raw[1:]))
        if key.verifier.key_id.hex() != hex_id:
            raise ValueError(f"signing key {name}: its key id does not match its key")
        return key

    def to_text(self) -> str:
        from cryptography.hazmat.primitives import serialization

        seed = self.private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        raw = base64.b64encode(bytes([ED25519]) + seed).decode()
        return f"PRIVATE+KEY+{self.name}+{self.verifier.key_id.hex()}+{raw}"

    @property
    def verifier(self) -> VerifierKey:
        """The public half, to give auditors."""
        public = self.private.public_key()
        return VerifierKey(self.name, _key_id(self.name, public.public_bytes_raw()), public)

    def sign(self, text: str) -> str:
        """``text`` (lines, each ending in a newline) as a signed note."""
        signature = self.verifier.key_id + self.private.sign(text.encode())
        return f"{text}\n{SIGNATURE_PREFIX}{self.name} {base64.b64encode(signature).decode()}\n"


# Key files


def create_signing_key(path: str | os.PathLike[str], name: str) -> tuple[Path, VerifierKey]:
    """Write a new signing key to ``path`` (0600, never over a file) and its verifier key to
    ``path`` plus ``.pub``; return that file and the key.

    The ``.pub`` file is 0644: it is the public half, meant to be handed to auditors.

    Raises:
        FileExistsError: there is a file at ``path`` or at its ``.pub`` already.
        ValueError: ``name`` is not a key name.
    """
    path = Path(path)
    key = SigningKey.generate(name)
    public = path.with_name(path.name + ".pub")
    for taken in (path, public):
        if taken.exists():
            raise FileExistsError(f"{taken} exists already: keys are never overwritten")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name, then linked into place (which fails if the name is taken):
    # a bus that finds the key never reads a half-written one.
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _write_new(partial, key.to_text(), 0o600)
        try:
            os.link(partial, path)
        except FileExistsError:
            raise
        except OSError:  # a filesystem without hard links: create the name itself
            _write_new(path, key.to_text(), 0o600)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    _write_new(public, key.verifier.to_text(), 0o644)
    return public, key.verifier


def _write_new(path: Path, line: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    os.fchmod(fd, mode)  # whatever the umask
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_signing_key(
    path: str | os.PathLike[str], *, db: str | os.PathLike[str] | None = None
) -> SigningKey:
    """Read the signing key at ``path``, refusing it if others may read or write it.

    A key in the database's directory is taken with a warning: whoever can replace the
    database there can often read the key too, and then sign a forged log.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        KeyExposed: the file's mode gives the group or others any access.
        ValueError: the file does not hold a signing key.
    """
    path = Path(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise KeyExposed(
            f"signing key {path} may be read by others (mode {mode:04o}): chmod 600 it, or make "
            "a new one if it may have been copied"
        )
    key = SigningKey.from_text(path.read_text(encoding="utf-8", errors="replace"))
    if db is not None and Path(db).resolve().parent in path.resolve().parents:
        logger.warning(
            "signing key %s lies in the activity log's directory: keep it where whoever can "
            "write the database cannot read it",
            path,
        )
    return key


def load_verifier_key(path: str | os.PathLike[str]) -> VerifierKey:
    """Read the verifier key in ``path`` (a ``.pub`` file).

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: it does not hold a verifier key.
    """
    return VerifierKey.from_text(Path(path).read_text(encoding="utf-8", errors="replace"))


# Checkpoints


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint says: the log (``origin``), a row id, and that row's chain."""

    origin: str
    size: int
    root: bytes

    def text(self) -> str:
        """The note's text, as signed."""
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"

    @classmethod
    def from_text(cls, text: str) -> Checkpoint:
        """Read a note's text.

        Raises:
            ValueError: it is not a checkpoint.
        """
        lines = text.split("\n")
        try:
            root = base64.b64decode(lines[2], validate=True)
        except (binascii.Error, IndexError):
            root = b""
        if len(lines) < 4 or not lines[1].isdigit() or len(root) != 32:
            raise ValueError("it is not a checkpoint (origin, size, root hash)")
        return cls(lines[0], int(lines[1]), root)


@dataclass(frozen=True)
class Note:
    """One signed note read from a file: its text and its signature lines (name, blob)."""

    line: int
    """The line of the file it starts on (1-based)."""
    text: str
    signatures: list[tuple[str, bytes]]


def read_notes(text: str) -> list[Note]:
    """Split a checkpoint file (notes one after the other, a blank line between two) into notes.

    A syslog file works too: the lines that hold :data:`SYSLOG_MARKER` are read, the rest
    ignored. A note whose signature lines are missing is kept with none, so that :func:`check`
    reports it.
    """
    if f"{SYSLOG_MARKER} " in text:
        return _syslog_notes(text)
    notes: list[Note] = []
    body: list[str] = []
    signatures: list[tuple[str, bytes]] = []
    start, blank = 0, False

    def flush() -> None:
        nonlocal body, signatures, blank
        if body:
            notes.append(Note(start, "\n".join(body) + "\n", signatures))
        body, signatures, blank = [], [], False

    for number, line in enumerate(text.split("\n"), 1):
        if line.startswith(SIGNATURE_PREFIX) and body and blank:
            signatures.append(_signature(line))
        elif not line:
            if signatures:
                flush()
            blank = bool(body)
        else:
            if blank:
                flush()
            if not body:
                start = number
            body.append(line)
    flush()
    return notes


def _syslog_notes(text: str) -> list[Note]:
    notes = []
    for number, line in enumerate(text.split("\n"), 1):
        _, marker, rest = line.partition(f"{SYSLOG_MARKER} ")
        try:
            note = json.loads(rest) if marker else None
        except ValueError:
            note = None
        if isinstance(note, str):
            notes += [replace(found, line=number) for found in read_notes(note)]
    return notes


def _signature(line: str) -> tuple[str, bytes]:
    name, _, blob = line.removeprefix(SIGNATURE_PREFIX).rpartition(" ")
    try:
        return name, base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        return name, b""


@dataclass
class Findings:
    """What :func:`check` found in the checkpoints."""

    problems: list[str] = field(default_factory=list)
    """What the rows or the notes contradict, first first."""
    signed: int = 0
    """How many checkpoints were signed by the key and match the rows."""
    last: int | None = None
    """The highest row id a good checkpoint signed."""


def check(
    notes: list[Note], key: VerifierKey, chain_at: Callable[[int], str | None], last_id: int
) -> Findings:
    """Hold every note against ``key`` and the rows.

    Args:
        chain_at: the stored ``chain`` of a row id, None if there is no such row.
        last_id: the log's last row id (0 if it has none).
    """
    found = Findings()
    for note in notes:
        problem = _check_note(note, key, chain_at, last_id)
        if problem is None:
            checkpoint = Checkpoint.from_text(note.text)
            found.signed += 1
            found.last = max(found.last or 0, checkpoint.size)
        else:
            found.problems.append(f"checkpoint at line {note.line}: {problem}")
    return found


def _check_note(
    note: Note, key: VerifierKey, chain_at: Callable[[int], str | None], last_id: int
) -> str | None:
    ours = [blob for name, blob in note.signatures if name == key.name and blob[:4] == key.key_id]
    if not ours:
        names = ", ".join(sorted({name for name, _ in note.signatures})) or "nobody"
        return f"it is not signed by {key.name} (signed by {names}): forged, or of another log"
    if not all(key.verify(note.text, blob[4:]) for blob in ours):
        return "its signature does not verify: the checkpoint was changed or forged"
    try:
        checkpoint = Checkpoint.from_text(note.text)
    except ValueError as exc:
        return str(exc)
    if checkpoint.origin != key.name:
        return f"it is of the log {checkpoint.origin!r}, not {key.name!r}"
    stored = chain_at(checkpoint.size)
    if stored is None and checkpoint.size > last_id:
        return (
            f"it signed row {checkpoint.size}, but the log ends at row {last_id}: rows were cut "
            "from its end, or the log was emptied or replaced"
        )
    if stored is None or stored != checkpoint.root.hex():
        return (
            f"row {checkpoint.size} is not the row it signed: the log was rewritten up to there "
            "(re-chained), or replaced"
        )
    return None


class Checkpointer:
    """Signs the head as it moves and appends each checkpoint to a file, and sends it to syslog
    if asked (a :class:`~bus.log.heads.HeadSink`; database thread).

    Args:
        key: the signing key; its name is the checkpoints' origin.
        path: the file, created 0600 if missing.
        syslog: a syslog daemon to send each checkpoint to as well, one datagram each:
            ``HOST:PORT`` (UDP) or the path of a Unix socket (``/dev/log``); None for none.
    """

    def __init__(
        self, key: SigningKey, path: str | os.PathLike[str], *, syslog: str | None = None
    ) -> None:
        self.key = key
        self.path = Path(path)
        self._syslog = None if syslog is None else _Syslog(syslog)
        self._file: TextIO | None = None
        self._last: Head | None = None

    def write(self, head: Head) -> None:
        """Sign ``head`` and append it, unless it is the one signed last.

        Raises:
            OSError: the file cannot be written or syslog reached; the next head will be tried.
        """
        if head == self._last:
            return
        note = self.key.sign(Checkpoint(self.key.name, head.id, bytes.fromhex(head.chain)).text())
        if self._file is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._file.write(note + "\n")
        self._file.flush()
        self._last = head
        if self._syslog is not None:
            self._syslog.send(note)

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        if self._syslog is not None:
            self._syslog.close()


SYSLOG_MARKER = "bcpbus-checkpoint"
"""What precedes a checkpoint in a syslog line: the note follows as one JSON string."""


class _Syslog:
    """Checkpoints as syslog datagrams (RFC 3164: ``<13>bcpbus: bcpbus-checkpoint "..."``,
    facility user, severity notice). A datagram never blocks the log's thread for long, and a
    note of about 200 bytes fits any syslog daemon's limit. The note goes as a JSON string, one
    line, so that :func:`read_notes` finds it again in the daemon's file."""

    def __init__(self, address: str) -> None:
        if address.startswith("/"):
            self._target: Any = address
            family = socket.AF_UNIX
        else:
            host, sep, port = address.rpartition(":")
            if not sep or not port.isdigit():
                raise ValueError(f"syslog {address!r}: give HOST:PORT or a socket path")
            family, _, _, _, self._target = socket.getaddrinfo(
                host.strip("[]"), int(port), type=socket.SOCK_DGRAM
            )[0]
        self._socket = socket.socket(family, socket.SOCK_DGRAM)

    def send(self, note: str) -> None:
        line = f"<13>bcpbus: {SYSLOG_MARKER} {json.dumps(note)}"
        self._socket.sendto(line.encode(), self._target)

    def close(self) -> None:
        self._socket.close()
