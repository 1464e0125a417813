"""JSON in and out, with orjson when it is installed (``pip install 'bcpbus[speed]'``).

Both paths accept exactly the same texts and give the same values, because a frame one bus
accepts and another refuses would make the wire depend on an optional extra:

- ``loads`` raises ``ValueError`` on anything that is not strict JSON (RFC 8259): ``NaN``,
  ``Infinity`` and numbers that overflow a double (``1e999``) are refused, as is a lone UTF-16
  surrogate escape (``"\\ud800"``), which is not a Unicode character and which SQLite, orjson and
  every strict receiver refuse to encode. Arrays and objects nested more than :data:`MAX_DEPTH`
  levels deep are refused too: the bus wraps what it forwards in a few more levels, and orjson
  cannot write more than 254. Integers outside 64 bits become floats, as orjson reads them.
- ``dumps`` returns compact text and raises ``ValueError`` on a non-finite float or a lone
  surrogate, rather than write a frame a strict parser would reject. ``dumpb`` is the same as
  UTF-8 bytes: what a frame is written as, without a decoded copy in between.
- ``fragment`` wraps JSON already encoded (by ``dumpb``; bytes or text) so that ``dumps`` and
  ``dumpb`` write it as it is: a message encoded once goes into every frame that carries it
  (orjson's ``Fragment``). Without orjson it is decoded again, which writes the same text.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["MAX_DEPTH", "dumpb", "dumps", "fragment", "loads"]

MAX_DEPTH = 128
"""The deepest nesting of arrays and objects a frame may have."""

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the optional extra being installed
    _orjson = None  # type: ignore[assignment]

_INT_MIN, _UINT_MAX = -(1 << 63), (1 << 64) - 1

# A high surrogate escape not followed by a low one, or a low one not preceded by a high one.
# Bounded pattern, linear on any input; only texts that contain "\\u" can match at all.
_LONE_SURROGATE = re.compile(
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("number is infinity when parsed as double")
    return value


def _int(text: str) -> int | float:
    value = int(text)  # more than 4300 digits raises ValueError (sys.int_max_str_digits)
    if _INT_MIN <= value <= _UINT_MAX:
        return value
    return _finite_float(text)


_DECODER = json.JSONDecoder(
    parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_int
)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _has_lone_surrogate(text: str | bytes) -> bool:
    if isinstance(text, bytes):
        if b"\\u" not in text:
            return False
        text = text.decode("utf-8", "replace")
    elif "\\u" not in text:
        return False
    # An escaped backslash before "u" ("\\\\ud800") is text, not an escape: drop those first.
    return _LONE_SURROGATE.search(text.replace("\\\\", "")) is not None


def _check_depth(text: str | bytes, value: Any) -> Any:
    # Only a text with more brackets than the limit can be nested that deep; counting them is a
    # C loop, so ordinary frames never pay for the walk.
    opened = (
        text.count("[") + text.count("{")
        if isinstance(text, str)
        else (text.count(b"[") + text.count(b"{"))
    )
    if opened > MAX_DEPTH and _depth(value) > MAX_DEPTH:
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep")
    return value


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def _std_loads(text: str | bytes) -> Any:
    if _has_lone_surrogate(text):
        raise ValueError("lone surrogate in string")
    try:
        value = _DECODER.decode(text if isinstance(text, str) else text.decode("utf-8"))
    except RecursionError as exc:
        # The stdlib parser recurses per nesting level; report it as what it is for the peer.
        raise ValueError("JSON nested too deeply") from exc
    return _check_depth(text, value)


def _std_dumps(obj: Any) -> str:
    text = _ENCODER.encode(obj)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("lone surrogate in string") from exc
    return text


def _orjson_loads(text: str | bytes) -> Any:
    try:
        value = _orjson.loads(text)
    except RecursionError as exc:  # pragma: no cover - depends on orjson's own depth limit
        raise ValueError("JSON nested too deeply") from exc
    return _check_depth(text, value)


def _orjson_dumps(obj: Any) -> str:
    try:
        return _orjson.dumps(obj).decode()
    except TypeError as exc:  # orjson.JSONEncodeError: surrogates, unsupported types
        raise ValueError(str(exc)) from exc


def _orjson_dumpb(obj: Any) -> bytes:
    try:
        data = _orjson.dumps(obj)
    except TypeError as exc:  # orjson.JSONEncodeError: surrogates, unsupported types
        raise ValueError(str(exc)) from exc
    # orjson writes NaN and infinities as null; refuse them as the stdlib path does.
    if b"null" in data and _has_non_finite(obj):
        raise ValueError("Out of range float values are not JSON compliant")
    return data


def _std_dumpb(obj: Any) -> bytes:
    return _std_dumps(obj).encode()


def _orjson_dumps_finite(obj: Any) -> str:
    text = _orjson_dumps(obj)
    # orjson writes NaN and infinities as null; refuse them as the stdlib path does.
    if "null" in text and _has_non_finite(obj):
        raise ValueError("Out of range float values are not JSON compliant")
    return text


def _has_non_finite(obj: Any) -> bool:
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return False


def _orjson_fragment(encoded: str | bytes) -> Any:
    return _orjson.Fragment(encoded)


def _std_fragment(encoded: str | bytes) -> Any:
    return _std_loads(encoded)


if _orjson is not None:
    loads = _orjson_loads
    dumps = _orjson_dumps_finite
    dumpb = _orjson_dumpb
    # Fragment came in orjson 3.9 (the ``speed`` extra asks for it); an older one decodes.
    fragment = _orjson_fragment if hasattr(_orjson, "Fragment") else _std_fragment
else:  # pragma: no cover - exercised when orjson is absent (tests/bus/test_json.py)
    loads = _std_loads
    dumps = _std_dumps
    dumpb = _std_dumpb
    fragment = _std_fragment

loads.__doc__ = "Parse strict JSON text; raise ``ValueError`` if it is anything else."
dumps.__doc__ = "Serialize ``obj`` to compact JSON text; raise ``ValueError`` if it is not JSON."
dumpb.__doc__ = "``dumps`` as UTF-8 bytes, encoded once: what a frame is written as."
fragment.__doc__ = (
    "Wrap JSON ``encoded`` by ``dumpb`` so that ``dumps``/``dumpb`` write it as it is; "
    "put the result where the value goes in the object being encoded."
)
