"""JSON in and out, with orjson when it is installed (``pip install 'bcpbus[speed]'``).

Both paths give the same results for what the wire carries: ``loads`` raises ``ValueError`` on
anything that is not JSON (including nesting too deep to parse), ``dumps`` returns compact text.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["dumps", "loads"]

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the optional extra being installed
    _orjson = None  # type: ignore[assignment]


def _std_loads(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except RecursionError as exc:
        # The stdlib parser recurses per nesting level; report it as what it is for the peer.
        raise ValueError("JSON nested too deeply") from exc


def _std_dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


if _orjson is not None:

    def loads(text: str | bytes) -> Any:
        """Parse JSON text; raise ``ValueError`` if it is not JSON."""
        return _orjson.loads(text)

    def dumps(obj: Any) -> str:
        """Serialize ``obj`` to compact JSON text."""
        return _orjson.dumps(obj).decode()

else:  # pragma: no cover - exercised when orjson is absent
    loads = _std_loads
    dumps = _std_dumps
