"""A sans-I/O JSON-RPC 2.0 session: text in, events and text out.

One :class:`Session` serves one connection, on either side. It never touches a socket and never
awaits; the I/O layer feeds it every text frame it reads and writes out every string it produces::

    session = Session()
    session.receive_text(raw)
    for event in session.events_received():   # Request | Notification | Response | ErrorResponse
        ...                                    # handle; later session.respond(event, result)
    for text in session.data_to_send():       # the I/O layer writes these
        await ws.send(text)

The session answers everything the specification says must be answered without asking the
application: parse errors (-32700, id null), invalid requests (-32600), an empty batch. It keeps
track of batches, so the application answers each request on its own, concurrently and in any
order, and the session sends one array for the batch once all its requests are answered (JSON-RPC
2.0 §6). Notifications are never answered. The parser never raises into the I/O layer.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from . import _json
from .errors import BusError, InternalError, InvalidRequest, ParseError

__all__ = [
    "ErrorResponse",
    "Event",
    "Notification",
    "Request",
    "RequestId",
    "Response",
    "Session",
]

RequestId = str | int | None
"""JSON-RPC ids are strings or integers; None where the request's id could not be read."""

Params = dict[str, Any] | list[Any] | None


@dataclass(frozen=True, slots=True)
class Request:
    """A call the other side expects an answer to: answer it with :meth:`Session.respond`."""

    id: RequestId
    method: str
    params: Params
    batch: int | None = None
    """Internal: the batch this request arrived in, so its answer joins the batch's array."""


@dataclass(frozen=True, slots=True)
class Notification:
    """A call without an id: never answered (§4.1)."""

    method: str
    params: Params


@dataclass(frozen=True, slots=True)
class Response:
    """The answer to a request this side sent with :meth:`Session.send_request`."""

    id: RequestId
    result: Any


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """An error answer; ``error`` is built with :meth:`BusError.from_error`."""

    id: RequestId
    error: BusError


Event = Request | Notification | Response | ErrorResponse


class _Batch:
    __slots__ = ("answers", "missing")

    def __init__(self) -> None:
        self.answers: list[dict[str, Any]] = []
        self.missing = 0


class Session:
    """The JSON-RPC state of one connection.

    Args:
        max_batch: the most elements a batch may have; a larger batch is answered with one
            -32600 error. None turns the limit off.
    """

    def __init__(self, *, max_batch: int | None = 1000) -> None:
        self.max_batch = max_batch
        self._events: list[Event] = []
        self._out: list[bytes] = []
        self._ids = itertools.count(1)
        self._batches: dict[int, _Batch] = {}
        self._batch_ids = itertools.count(1)
        self._errors: list[BusError] = []

    # Input

    def receive_text(self, text: str | bytes) -> None:
        """Parse one frame.

        You must call :meth:`events_received` to handle what it contained, then
        :meth:`data_to_send` to write out the answers the session made on its own.
        """
        try:
            message = _json.loads(text)
        except ValueError:
            # JSON-RPC 2.0 §5: the id is null when the request could not be read.
            self._send_error(None, ParseError())
            return
        if isinstance(message, list):
            self._receive_batch(message)
            return
        answer = self._receive_one(message, None)
        if answer is not None:
            self._out.append(_json.dumpb(answer))

    def _receive_batch(self, elements: list[Any]) -> None:
        if not elements:
            self._send_error(None, InvalidRequest("Invalid request: empty batch"))
            return
        if self.max_batch is not None and len(elements) > self.max_batch:
            self._send_error(
                None, InvalidRequest(f"Invalid request: batch larger than {self.max_batch}")
            )
            return
        batch_id = next(self._batch_ids)
        batch = _Batch()
        self._batches[batch_id] = batch
        for element in elements:
            answer = self._receive_one(element, batch_id)
            if answer is not None:
                batch.answers.append(answer)
        self._finish_batch(batch_id)

    def _receive_one(self, message: Any, batch_id: int | None) -> dict[str, Any] | None:
        """Turn one message into an event; return an immediate error answer, if any."""
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return self._invalid(
                _read_id(message), InvalidRequest("Invalid request: not JSON-RPC 2.0")
            )
        if "method" in message:
            return self._receive_call(message, batch_id)
        if "result" in message or "error" in message:
            self._receive_answer(message)
            return None
        return self._invalid(_read_id(message), InvalidRequest("Invalid request: no method"))

    def _receive_call(self, message: dict[str, Any], batch_id: int | None) -> dict[str, Any] | None:
        method = message["method"]
        params = message.get("params")
        has_id = "id" in message
        request_id = message.get("id")
        if has_id and not _valid_id(request_id):
            return self._invalid(
                None, InvalidRequest("Invalid request: id must be a string or integer")
            )
        if not isinstance(method, str):
            return self._invalid(
                request_id, InvalidRequest("Invalid request: method must be a string")
            )
        if params is not None and not isinstance(params, dict | list):
            return self._invalid(
                request_id, InvalidRequest("Invalid request: params must be an object or array")
            )
        if not has_id:
            self._events.append(Notification(method, params))
            return None
        if batch_id is not None:
            self._batches[batch_id].missing += 1
        self._events.append(Request(request_id, method, params, batch_id))
        return None

    def _receive_answer(self, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        if not _valid_id(request_id):
            return  # An answer we cannot match to anything; there is no one to tell.
        if "error" in message:
            self._events.append(ErrorResponse(request_id, BusError.from_error(message["error"])))
        else:
            self._events.append(Response(request_id, message["result"]))

    def events_received(self) -> list[Event]:
        """Return the events parsed since the last call, and forget them.

        Answer every :class:`Request` with :meth:`respond` or :meth:`respond_error`, exactly
        once, then call :meth:`data_to_send`.
        """
        events, self._events = self._events, []
        return events

    # Output

    def respond(self, request: Request, result: Any) -> None:
        """Answer ``request`` with ``result``; then call :meth:`data_to_send`."""
        self._answer(request, {"jsonrpc": "2.0", "id": request.id, "result": result})

    def respond_error(self, request: Request, error: BusError) -> None:
        """Answer ``request`` with ``error``; then call :meth:`data_to_send`."""
        self._answer(request, _error(request.id, error))

    def refuse(self, request: Request, error: BusError) -> None:
        """Answer ``request`` with ``error`` without handing it to the application (a limit),
        and count the error in :meth:`errors_sent`; then call :meth:`data_to_send`."""
        self._errors.append(error)
        self.respond_error(request, error)

    def _answer(self, request: Request, answer: dict[str, Any]) -> None:
        if request.batch is None:
            self._out.append(_dumps_answer(answer))
            return
        batch = self._batches.get(request.batch)
        if batch is None:
            raise RuntimeError("request already answered")
        batch.answers.append(answer)
        batch.missing -= 1
        self._finish_batch(request.batch)

    def _finish_batch(self, batch_id: int) -> None:
        batch = self._batches[batch_id]
        if batch.missing:
            return
        del self._batches[batch_id]
        # §6: a batch of notifications only is answered with nothing at all.
        if batch.answers:
            self._out.append(_dumps_answer(batch.answers))

    def send_request(self, method: str, params: Params | Any = None) -> int:
        """Queue a request to the other side and return its id. ``params`` is a dict, a list,
        or params encoded already (an ``orjson.Fragment``: a fan-out encodes them once for all
        its targets), written as they are.

        Match the :class:`Response` or :class:`ErrorResponse` event with the same id to it.
        Then call :meth:`data_to_send`.
        """
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self._out.append(_json.dumpb(message))
        return request_id

    def send_notification(self, method: str, params: Params = None) -> None:
        """Queue a notification (no answer will come); then call :meth:`data_to_send`."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._out.append(_json.dumpb(message))

    def errors_sent(self) -> list[BusError]:
        """Return the errors the session answered on its own since the last call (parse errors,
        invalid requests), and forget them: the I/O layer logs them."""
        errors, self._errors = self._errors, []
        return errors

    def data_to_send(self) -> list[bytes]:
        """Return the frames to write, in order, and forget them: each is UTF-8 JSON, to be
        written as a text frame as it is (``ws.send(frame, text=True)``), never decoded."""
        out, self._out = self._out, []
        return out

    def _send_error(self, request_id: RequestId, error: BusError) -> None:
        self._errors.append(error)
        self._out.append(_json.dumpb(_error(request_id, error)))

    def _invalid(self, request_id: RequestId, error: BusError) -> dict[str, Any]:
        self._errors.append(error)
        return _error(request_id, error)


def _dumps_answer(answer: Any) -> bytes:
    try:
        return _json.dumpb(answer)
    except ValueError:
        # A result that is not JSON (NaN, a lone surrogate) must not become a frame that strict
        # peers reject, nor an exception in the I/O layer: answer -32603 in its place.
        if isinstance(answer, list):
            return _json.dumpb([_unencodable(item) for item in answer])
        return _json.dumpb(_unencodable(answer))


def _unencodable(answer: dict[str, Any]) -> dict[str, Any]:
    try:
        _json.dumpb(answer)
    except ValueError:
        return _error(answer.get("id"), InternalError())
    return answer


def _valid_id(value: Any) -> bool:
    # JSON-RPC 2.0 §4: a string, a number without fraction, or null. bool is an int in Python.
    return value is None or isinstance(value, str) or (type(value) is int)


def _read_id(message: Any) -> RequestId:
    if isinstance(message, dict):
        value = message.get("id")
        if _valid_id(value):
            return value
    return None


def _error(request_id: RequestId, error: BusError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_error()}
