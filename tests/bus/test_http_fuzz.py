"""Property-based fuzzing of the HTTP binding from its own OpenAPI document (schemathesis).

Every operation of ``/openapi.json`` gets generated requests, valid and invalid, sent to a real
bus; each answer must be documented (status, content type, body schema) and never a 5xx. The
examples per operation are few, so the run stays a few seconds; ``BCPBUS_FUZZ_EXAMPLES`` raises
it for a longer run by hand.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings, strategies as st
from schemathesis import GenerationMode, checks

from bus.ops.config import HttpSettings
from peers.testing import running_bus

EXAMPLES = int(os.environ.get("BCPBUS_FUZZ_EXAMPLES", "5"))

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


def fuzz(document: dict[str, Any], base_url: str, token: str) -> list[str]:
    """Run every operation's examples; return the operations that were exercised."""
    schema = schemathesis.openapi.from_dict(document)
    exercised: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        cases = st.one_of(
            operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
            operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
        )

        @given(case=cases)
        @settings(
            max_examples=2 * EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Any) -> None:
            # The peer's own token, over whatever the case drew for the bearer scheme, so the
            # requests get past authentication to the checks behind it.
            headers = {**(case.headers or {}), "Authorization": f"Bearer {token}"}
            case.call_and_validate(base_url=base_url, headers=headers, checks=CHECKS)

        run()
        exercised.append(operation.label)
    return exercised


async def test_the_http_api_answers_what_its_openapi_document_promises(tmp_path):
    """Generated requests to every operation get documented, well-formed, non-5xx answers."""
    async with running_bus(tmp_path, http=HttpSettings(port=0)) as h:
        token = h.token("tg:fuzz")
        async with httpx.AsyncClient(base_url=h.http_url) as client:
            document = (await client.get("/openapi.json")).json()
        exercised = await asyncio.to_thread(fuzz, document, h.http_url, token)
        assert "POST /v1/messages" in exercised and "GET /metrics" in exercised
        # The bus is still up and serving after all of it.
        async with httpx.AsyncClient(base_url=h.http_url) as client:
            assert (await client.get("/healthz")).status_code == 200
