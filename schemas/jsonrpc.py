"""Pydantic models of the JSON-RPC 2.0 envelopes, for JSON Schema generation and for peers.

The bus's own parser (:mod:`bus.core.protocol`) checks frames by hand for speed and for the exact
error codes JSON-RPC 2.0 asks for; these models describe the same shapes for other languages.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["ErrorObject", "ErrorResponse", "Notification", "Request", "RequestId", "Response"]

RequestId = str | int
"""A request id: JSON-RPC allows strings and numbers; the bus answers with the id it was sent."""


class Request(BaseModel):
    """A call that expects an answer."""

    model_config = ConfigDict(extra="forbid")
    jsonrpc: Literal["2.0"]
    id: RequestId
    method: str
    params: dict[str, Any] | list[Any] | None = None


class Notification(BaseModel):
    """A call without ``id``: never answered (JSON-RPC 2.0 §4.1)."""

    model_config = ConfigDict(extra="forbid")
    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any] | list[Any] | None = None


class Response(BaseModel):
    """A successful answer."""

    model_config = ConfigDict(extra="forbid")
    jsonrpc: Literal["2.0"]
    id: RequestId
    result: Any


class ErrorObject(BaseModel):
    """The ``error`` member of an error response; codes are listed in docs/protocol.md."""

    model_config = ConfigDict(extra="forbid")
    code: int
    message: str
    data: Any = None


class ErrorResponse(BaseModel):
    """An error answer; ``id`` is null when the request's id could not be read (§5)."""

    model_config = ConfigDict(extra="forbid")
    jsonrpc: Literal["2.0"]
    id: RequestId | None
    error: ErrorObject
