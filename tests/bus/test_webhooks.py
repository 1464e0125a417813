"""The pure parts of bus/transports/webhooks.py and schemas/http.py: delays, answers, signatures."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json

import pytest
from hypothesis import given, strategies as st

from bus.core.errors import InvalidParams
from bus.transports.webhooks import _answer, retry_delays
from schemas.http import check_traceparent, signature


@given(st.floats(min_value=0.001, max_value=10))
def test_retry_delays_double_up_to_eight_times_the_first_within_the_jitter(initial):
    """Each delay is twice the last (capped at 8x the first), give or take a fifth."""
    delays = list(itertools.islice(retry_delays(initial), 8))
    for number, delay in enumerate(delays):
        nominal = initial * min(2**number, 8)
        assert nominal * 0.8 <= delay <= nominal * 1.2


def test_an_answer_is_a_result_an_error_or_malformed():
    """A 2xx body is the result, a JSON-RPC error, or malformed (never retried)."""
    ok = _answer(3, json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"processed": True}}).encode())
    assert ok.result == {"processed": True} and ok.reason is None
    error = _answer(3, b'{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"no"}}')
    assert isinstance(error.error, InvalidParams) and error.reason is None
    for body in (b"<html>", b"[]", b'{"id":4,"result":1}', b'{"id":3}'):
        bad = _answer(3, body)
        assert bad.reason == "malformed_response" and not bad.retry, body


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":3,"result":{"processed":NaN}}',
        b'{"jsonrpc":"2.0","id":3,"result":{"n":Infinity}}',
        b'{"jsonrpc":"2.0","id":3,"result":{"processed":true,"t":"\\ud800"}}',
        b'{"jsonrpc":"2.0","id":3,"result":{"t":"\xff"}}',
    ],
)
def test_an_answer_that_is_not_strict_json_is_malformed(body):
    """NaN, Infinity, a lone surrogate or bytes that are not UTF-8 make an answer malformed."""
    assert _answer(3, body).reason == "malformed_response"


@given(st.text(min_size=1), st.binary())
def test_the_signature_is_the_hmac_of_timestamp_dot_body(secret, body):
    """What the docs tell receivers to compute is what the bus sends."""
    mac = hmac.new(secret.encode(), b"1767225600." + body, hashlib.sha256).hexdigest()
    assert signature(secret, "1767225600", body) == f"sha256={mac}"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "version ff"),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", "trace id"),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", "parent id"),
        ("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", "expected"),
    ],
)
def test_traceparent_rules_beyond_the_pattern(value, error):
    """W3C Trace Context: no version ff, no all-zero ids, lowercase hex."""
    with pytest.raises(ValueError, match=error):
        check_traceparent(value)
    ok = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert check_traceparent(ok) == ok
