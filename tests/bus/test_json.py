"""One JSON behaviour with or without the ``speed`` extra: orjson and the stdlib path agree."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from bus.core import _json

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(_json._orjson is None, reason="needs orjson to compare with")

BACKENDS = {"orjson": _json._orjson_loads, "stdlib": _json._std_loads}
DUMPERS = {
    "orjson": _json._orjson_dumps_finite,
    "stdlib": _json._std_dumps,
    "orjson bytes": _json._orjson_dumpb,
    "stdlib bytes": _json._std_dumpb,
}


def outcome(loads: Any, text: str) -> Any:
    """The parsed value, or the marker that the text was refused."""
    try:
        return ("ok", loads(text))
    except ValueError:
        return ("refused", None)


REFUSED = [
    '{"a":"\\ud800"}',
    '{"a":"\\udfff"}',
    '{"a":"x\\ud83d"}',
    '{"\\udc00":1}',
    '{"a":"\\\\\\ud800"}',
    '{"a":NaN}',
    '{"a":Infinity}',
    '{"a":-Infinity}',
    '{"a":1e999}',
    '{"a":-1e400}',
    "[" * 129 + "]" * 129,
    "[" * 5000 + "]" * 5000,
    '{"a":1}x',
    "",
    "\ufeff{}",
]
ACCEPTED = [
    ('{"a":"\\ud83d\\ude00"}', {"a": "\U0001f600"}),
    ('{"a":"\\\\ud800"}', {"a": "\\ud800"}),
    ('{"a":18446744073709551615}', {"a": 18446744073709551615}),
    ('{"a":18446744073709551616}', {"a": 1.8446744073709552e19}),
    ('{"a":1.5e308}', {"a": 1.5e308}),
    ("[" * 128 + "]" * 128, None),
]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("text", REFUSED)
def test_what_is_not_strict_json_is_refused(name, text):
    """Lone surrogates, non-finite numbers, over-deep nesting and trailing data are refused."""
    with pytest.raises(ValueError):
        BACKENDS[name](text)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize(("text", "value"), ACCEPTED)
def test_edge_values_read_the_same(name, text, value):
    """Surrogate pairs, escaped backslashes, 64-bit edges and depth 128 are accepted alike."""
    parsed = BACKENDS[name](text)
    if value is not None:
        assert parsed == value


@pytest.mark.parametrize("name", DUMPERS)
@pytest.mark.parametrize("value", [{"a": math.nan}, {"a": [math.inf]}, {"a": "\ud800"}])
def test_dumps_refuses_what_strict_parsers_would_reject(name, value):
    """Neither backend writes NaN, infinities (orjson would write null) or lone surrogates."""
    with pytest.raises(ValueError):
        DUMPERS[name](value)


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None, categories=None), max_size=8)
)
_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_backends_agree_on_generated_documents(value):
    """Any document (surrogates, NaN, big integers included) reads the same in both backends."""
    text = json.dumps(value, ensure_ascii=True)  # the stdlib writes what strict JSON refuses
    assert outcome(_json._orjson_loads, text) == outcome(_json._std_loads, text)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet='[]{}"\\u0123456789abcdefDdn:,aNI ', max_size=40))
def test_backends_agree_on_generated_texts(text):
    """Arbitrary near-JSON texts are accepted or refused alike, with the same value."""
    assert outcome(_json._orjson_loads, text) == outcome(_json._std_loads, text)


def test_wire_suite_passes_without_orjson():
    """The protocol and hardening suites pass with orjson unimportable (the stdlib path)."""
    code = (
        "import sys; sys.modules['orjson'] = None; import pytest; import bus.core._json as j; "
        "assert j.loads is j._std_loads; "
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
        "'tests/bus/test_protocol.py', 'tests/bus/test_hardening.py']))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


def _written(dump: Any, value: Any) -> Any:
    """What ``dump`` writes for ``value`` as text, or the marker that it refused."""
    try:
        data = dump(value)
    except ValueError:
        return ("refused", None)
    return ("ok", data.decode() if isinstance(data, bytes) else data)


@settings(max_examples=400, deadline=None)
@given(_values)
def test_frames_as_bytes_are_the_text_encoded(value):
    """``dumpb`` (what frames are written with) writes exactly ``dumps``'s text as UTF-8, and
    refuses the same documents, in both backends."""
    assert _written(_json._orjson_dumpb, value) == _written(_json._orjson_dumps_finite, value)
    assert _written(_json._std_dumpb, value) == _written(_json._std_dumps, value)
