"""Reading request params: models with errors a person can act on, and a fast ``sendMessage``.

:func:`parse` validates params against a :mod:`schemas.bus` model and turns the first pydantic
error into a -32602 that names the field. :func:`read_send_message` does the same for
``sendMessage`` but checks the usual shape by hand first, since it runs on every message.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from pydantic import BaseModel, ValidationError

from schemas.bus import Envelope, SendMessageParams
from schemas.common import trace_id, traceparent_problem

from .errors import InvalidParams

__all__ = ["SendFields", "parse", "read_send_message"]

M = TypeVar("M", bound=BaseModel)


class SendFields(NamedTuple):
    """What the bus reads from valid ``sendMessage`` params."""

    topic: str
    message_id: str
    type: str
    sender: str
    relevance: float | None = None
    """The envelope's ``relevance``, if any."""
    trace_id: str | None = None
    """The trace id of the envelope's ``traceparent``, if any."""


def read_send_message(params: Any) -> SendFields:
    """Validate ``sendMessage`` params as :class:`SendMessageParams` does; return their fields.

    Raises:
        InvalidParams: as :func:`_parse` would.
    """
    fields = _fast_send_message(params)
    if fields is not None:
        return fields
    # Anything the fast path is unsure of gets the model's full validation and error messages.
    model = parse(SendMessageParams, params)
    payload = model.payload
    return SendFields(
        model.topic,
        payload.message_id,
        payload.type,
        payload.from_,
        payload.relevance,
        None if payload.traceparent is None else trace_id(payload.traceparent),
    )


def _constraint(field: str, name: str, model: type[BaseModel] = Envelope) -> Any:
    """A constraint of a model's field (``pattern``, ``max_length``...)."""
    for item in model.model_fields[field].metadata:
        value = getattr(item, name, None)
        if value is not None:
            return value
    raise LookupError(f"{model.__name__}.{field} has no {name}")  # pragma: no cover - drift


# The fast path accepts only what the models accept (tests/bus/test_server_fast_path.py):
# the usual shape of a sendMessage, with the constraints read from the models themselves.
# Everything else falls back to pydantic. Skipping pydantic on the common path saves ~7% of
# the bus's CPU per message (bench/README.md). Python's ``$`` would accept a trailing
# newline; ``fullmatch`` does not.
_TOPIC_MAX = _constraint("topic", "max_length", SendMessageParams)
_ID_MAX = _constraint("message_id", "max_length")
_CORRELATION_MAX = _constraint("correlation_id", "max_length")
_TYPE_RE = re.compile(_constraint("type", "pattern"))
_FROM_RE = re.compile(_constraint("from_", "pattern"))
# RFC 3339 with a zone, each field in range (fromisoformat would take an offset of +10:87),
# as AwareDatetime reads it; datetime.fromisoformat then checks the day of the month.
_TIMESTAMP_RE = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
    r"(?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
)
_REQUIRED = frozenset({"messageId", "type", "from", "timestamp", "content"})
_ALLOWED = _REQUIRED | {"correlationId", "traceparent", "relevance"}


def _fast_send_message(params: Any) -> SendFields | None:
    """The fields of ``params`` if they are plainly valid ``sendMessage`` params, else None."""
    if type(params) is not dict or len(params) != 2:
        return None
    topic, payload = params.get("topic"), params.get("payload")
    if type(topic) is not str or not 0 < len(topic) <= _TOPIC_MAX or type(payload) is not dict:
        return None
    if not (_REQUIRED <= payload.keys() <= _ALLOWED):
        return None
    message_id, message_type, sender = payload["messageId"], payload["type"], payload["from"]
    if (
        type(message_id) is not str
        or not 0 < len(message_id) <= _ID_MAX
        or type(message_type) is not str
        or _TYPE_RE.fullmatch(message_type) is None
        or type(sender) is not str
        or _FROM_RE.fullmatch(sender) is None
        or not _valid_timestamp(payload["timestamp"])
        or not _valid_content(payload["content"])
        or not _valid_optional(payload)
    ):
        return None
    trace = payload.get("traceparent")
    return SendFields(
        topic,
        message_id,
        message_type,
        sender,
        payload.get("relevance"),
        None if trace is None else trace_id(trace),
    )


def _valid_timestamp(value: Any) -> bool:
    if type(value) is not str or _TIMESTAMP_RE.fullmatch(value) is None:
        return False
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return False
    return True


def _valid_content(value: Any) -> bool:
    return type(value) is dict and all(type(key) is str for key in value)


def _valid_optional(payload: dict[str, Any]) -> bool:
    correlation = payload.get("correlationId")
    if correlation is not None and (
        type(correlation) is not str or len(correlation) > _CORRELATION_MAX
    ):
        return False
    trace = payload.get("traceparent")
    if trace is not None and (type(trace) is not str or traceparent_problem(trace) is not None):
        return False
    relevance = payload.get("relevance")
    # As the model's strict float: an int or a float (never a bool), finite, within [0, 1].
    return relevance is None or (
        type(relevance) in (int, float) and math.isfinite(relevance) and 0 <= relevance <= 1
    )


def parse(model: type[M], params: Any) -> M:
    if not isinstance(params, dict):
        raise InvalidParams("Invalid params: params must be an object")
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "params"
        raise InvalidParams(
            f"Invalid params: {where}: {first['msg']}",
            data=[
                {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"]} for e in exc.errors()
            ],
        ) from None
