"""The canonical JSON of a value and its SHA-256: what digests in the log are computed over.

Pure (no I/O), so the gateway's core and the bus's decisions can use it. Anyone holding a
message recomputes its digest with :func:`canonical_sha256` and compares it with the log's.
:data:`LogContent` names whether a log keeps content in full or only these digests.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

__all__ = ["LogContent", "canonical_json", "canonical_sha256"]

LogContent = Literal["full", "digest"]
"""What the log keeps of each message: ``full``, or ``digest`` (its type and the
:func:`canonical_sha256` of its content); see :class:`bus.ops.config.ServeConfig`."""


def canonical_json(value: Any) -> bytes:
    """``value`` as canonical JSON: keys sorted, no spaces, UTF-8, non-ASCII kept as is.

    The form digests are computed over, so that anyone holding a message can recompute them.

    Raises:
        TypeError, ValueError: ``value`` is not JSON (an object JSON cannot hold, NaN).
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def canonical_sha256(value: Any) -> str:
    """The hex SHA-256 of :func:`canonical_json` of ``value``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
