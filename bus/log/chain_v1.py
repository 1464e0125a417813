"""Version 1 of the activity log's chain, kept to check the logs written before version 2.

Version 1 chained each row with an HMAC-SHA-256 under a key kept in a file of its own
(``<db>.key`` by default): ``chain`` is the hex HMAC of the previous row's ``chain`` (32 bytes)
followed by the row's canonical content, each column not NULL in name order as its name, a NUL,
its length in code points, a NUL and its value as text. It is retired because whoever can verify
it can also forge it (the key is symmetric), and because the value as text loses its storage
class (an integer ``5`` and the text ``'5'`` hash alike). :mod:`bus.log.chain` (version 2) checks a
version-1 stretch of a log with :class:`LegacyVerifier` when it is given the key, and a bus that
opens such a log starts a version-2 segment that binds every row before it.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .segments import GENESIS, Problem, SegmentChecks

__all__ = [
    "LEGACY_VERSION",
    "LegacyVerifier",
    "default_key_path",
    "encode_row",
    "fields_of",
    "key_id",
    "load_key",
]

logger = logging.getLogger("bus.log.activity")

LEGACY_VERSION = 1
"""What a version-1 ``chain_start`` row declares (``"chain": 1``)."""


def default_key_path(db: str | os.PathLike[str]) -> Path:
    """The key file of the log at ``db`` when none is given: ``<db>.key`` beside it."""
    db = Path(db)
    return db.with_name(db.name + ".key")


def load_key(path: str | os.PathLike[str]) -> bytes:
    """Read the key at ``path`` (64 hex digits); warn if others may read it.

    Raises:
        FileNotFoundError: there is no key at ``path``.
        ValueError: the file does not hold a key.
    """
    path = Path(path)
    text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ValueError(f"{path} does not hold an activity log key (64 hex digits)")
    if path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        logger.warning("the activity log's key %s may be read by others: chmod 600 it", path)
    return key


def key_id(key: bytes) -> str:
    """A name for ``key`` that gives nothing of it away: 16 hex digits, kept in ``chain_start``."""
    return hmac.digest(key, b"bcpbus activity log key id", "sha256").hex()[:16]


Fields = list[tuple[str, int]]
"""The chained columns of a row layout: each name with its index, in name order."""


def fields_of(names: Sequence[str]) -> Fields:
    """The :data:`Fields` of rows whose columns are ``names`` (``chain`` is left out)."""
    return sorted((name, i) for i, name in enumerate(names) if name != "chain")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"a chained column holds {type(value).__name__}, not text or a number")
    return repr(value) if isinstance(value, float) else str(value)


def encode_row(fields: Fields, values: Sequence[Any]) -> bytes:
    """The canonical content of the row ``values`` laid out as ``fields`` say.

    Raises:
        TypeError: a value is neither text nor a number (a BLOB).
        UnicodeEncodeError: a value is not valid Unicode (SQLite would refuse it too).
    """
    try:
        # The common case, every value text: one pass, no conversions.
        text = "".join(
            [f"{name}\0{len(v)}\0{v}" for name, i in fields if (v := values[i]) is not None]
        )
    except TypeError:  # a number: len() of it fails
        converted = [None if v is None else _text(v) for v in values]
        text = "".join(
            [f"{name}\0{len(v)}\0{v}" for name, i in fields if (v := converted[i]) is not None]
        )
    return text.encode()


@dataclass
class LegacyVerifier(SegmentChecks):
    """Check rows chained by version 1, oldest first; collect what does not match.

    Feed every row (id order) to :meth:`check` as a mapping of column to value; then
    :attr:`problems` holds what is wrong, first first. Rows before the first ``chain_start``
    with no ``chain`` were written before the log was chained: the ``chain_start`` that follows
    them binds them (its payload's ``previous``), so they are checked too.

    ``previous`` in a ``chain_start`` payload is ``{"rows", "last_id", "chain"}``: how many rows
    came before it, the last one's id, and the hex :attr:`run` over them (the chain as it would
    be had every row been chained, each segment from its ``chain_start``), as they were when the
    segment started.

    Args:
        key: the log's key.
        start: report nothing wrong before this row id (a segment's ``chain_start``), but still
            check that its ``previous`` matches the rows before it.
    """

    key: bytes
    start: int = 0
    problems: list[Problem] = field(default_factory=list)
    rows: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)
    """The ``chain_start`` rows seen: id, ts, and their payload."""

    def __post_init__(self) -> None:
        self._mac = hmac.new(self.key, digestmod="sha256")
        self._key_id = key_id(self.key)
        self._start_links()

    def _hmac(self, prev: bytes, content: bytes) -> bytes:
        mac = self._mac.copy()
        mac.update(prev)
        mac.update(content)
        return mac.digest()

    def columns(self, names: Sequence[str]) -> None:
        """Say which columns the rows given to :meth:`check` have, in their order."""
        self._fields = fields_of(names)
        self._index(names)

    def check(self, values: Sequence[Any]) -> None:
        """Check one row, its ``values`` in the order :meth:`columns` gave."""
        row_id, stored = self._seen(values)
        content = self._content(row_id, values)
        digest: bytes | None = None
        if self._starts_segment(values, stored):
            digest = self._segment(dict(zip(self._names, values, strict=True)), content, stored)
        elif stored is None and not self._chained:
            self._run = self._hmac(self._run, content)  # written before the log was chained
        else:
            digest = self._link(row_id, stored, content, self._hmac)
        self._moved_on(row_id, stored, digest)

    def _content(self, row_id: Any, values: Sequence[Any]) -> bytes:
        text = list(values)
        text[self._id] = str(row_id)
        try:
            # A BLOB encodes as its repr, which no text the writer hashed matches.
            return encode_row(self._fields, text)
        except (TypeError, UnicodeEncodeError) as exc:
            self._bad(row_id, f"it holds what the writer never stores ({exc})")
            return repr(text).encode("utf-8", "replace")

    def _segment(self, row: dict[str, Any], content: bytes, stored: str) -> bytes:
        row_id, payload = self._segment_seen(row)
        wrong = None
        if payload.get("chain") != LEGACY_VERSION:
            wrong = f"it starts a chain of version {payload.get('chain')!r}, not {LEGACY_VERSION}"
        elif payload.get("key_id") != self._key_id:
            wrong = (
                f"its segment was chained with another key (key id {payload.get('key_id')}; the "
                f"key given has {self._key_id}): give that key"
            )
        return self._open_segment(row_id, payload, stored, self._hmac(GENESIS, content), wrong)
