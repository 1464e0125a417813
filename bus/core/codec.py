"""The bus's JSON codec, for code outside the bus that must read and write frames as it does.

The same strict JSON as the bus (orjson when installed, the standard library otherwise; both
accept exactly the same texts): :func:`loads` raises ``ValueError`` on anything that is not
strict RFC 8259 JSON or nests deeper than :data:`MAX_DEPTH`, :func:`dumps` on a value a strict
parser would reject. The baseline relay of ``python -m bench`` uses it so that it pays the
bus's JSON cost, no more and no less.
"""

from __future__ import annotations

from ._json import MAX_DEPTH, dumps, loads

__all__ = ["MAX_DEPTH", "dumps", "loads"]
