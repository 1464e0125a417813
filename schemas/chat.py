"""Content models of the chat and agent types: how a chat gets an agent and talks to it.

The bus checks only the envelope and the policy for these types (``content`` is any object the
two ends agree on); these models are what the reference peers agree on: ``bcpbus system``,
``bcpbus chat`` and the echo agent. The bootstrap flow, in the order it happens:

.. code-block:: text

    tg:<chat>    -- spawn_request {agent} ---------------> system:spawn   (agent:system reads it)
    agent:system -- spawn_result {agent, success, ...} --> tg:<chat>      correlationId: the request
    agent:system -- route_assigned {chat, agent} --------> tg:<chat>
    tg:<chat>    -- configure {talkto} ------------------> agent:<name>
    tg:<chat>    -- tg_message {id, text} ---------------> agent:<name>   retried until answered
    agent:<name> -- tg_reply {in_reply_to, text} --------> tg:<chat>

On a definition's ``cron_schedules``, at the times each names::

    agent:system -- scheduled_message {message, schedule, at} --> agent:<name>

Look a model up by its type in :data:`CONTENT_MODELS`. :class:`AgentLifecycle` is the content of
the ``agent_event`` the system peer publishes on :data:`AGENTS_TOPIC` when it starts or loses an
agent process; other agents' ``agent_event`` content is their own.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final, Literal, Self

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from schemas.bcp import AGENT_NAME_PATTERN, ID_PATTERN
from schemas.bus import CLIENT_ID_PATTERN
from schemas.common import ClientId, Topic

__all__ = [
    "AGENTS_TOPIC",
    "CONTENT_MODELS",
    "MAX_TEXT",
    "SPAWN_TOPIC",
    "SYSTEM_CLIENT_ID",
    "AgentLifecycle",
    "Configure",
    "RouteAssigned",
    "ScheduledMessage",
    "SpawnError",
    "SpawnRequest",
    "SpawnResult",
    "TgMessage",
    "TgReply",
]

SYSTEM_CLIENT_ID: Final = ClientId("agent:system")
"""The system peer's clientId: the default policy's ``system`` role."""

SPAWN_TOPIC: Final = Topic("system:spawn")
"""Where chats send ``spawn_request``; the system peer subscribes to it."""

AGENTS_TOPIC: Final = Topic("system:agents")
"""Where the system peer publishes :class:`AgentLifecycle` events (for the activity log)."""

MAX_TEXT: Final = 16384
"""Most characters in the text of a ``tg_message`` or ``tg_reply``."""

_AgentName = Annotated[StrictStr, Field(pattern=AGENT_NAME_PATTERN)]
_ClientId = Annotated[StrictStr, Field(pattern=CLIENT_ID_PATTERN)]
_Id = Annotated[StrictStr, Field(pattern=ID_PATTERN)]
_Text = Annotated[StrictStr, Field(min_length=1, max_length=MAX_TEXT)]


class _Content(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpawnError(StrEnum):
    """Why the system peer did not start an agent (``spawn_result`` ``error``)."""

    UNKNOWN_AGENT = "unknown_agent"
    """No definition with that name in the system peer's agents folder."""
    NOT_SPAWNABLE = "not_spawnable"
    """The definition has no ``command:``, or names the system peer itself."""
    NO_TOKEN = "no_token"
    """No usable token for the agent: missing, empty, or readable by other users."""
    START_FAILED = "start_failed"
    """The command could not be started (not found, not executable)."""
    DEFINITION_ERROR = "definition_error"
    """The agents folder does not load; ``detail`` names the file and field."""


class SpawnRequest(_Content):
    """``spawn_request``, chat -> ``system:spawn``: start this agent (if it is not running) and
    route me to it."""

    agent: _AgentName
    """The agent definition's ``name``."""


class SpawnResult(_Content):
    """``spawn_result``, system -> the chat: the answer to its ``spawn_request``, whose
    ``messageId`` is this message's ``correlationId``."""

    agent: _AgentName
    success: StrictBool
    status: Literal["started", "running"] | None = None
    """On success: ``started`` (a new process) or ``running`` (it was already)."""
    error: SpawnError | None = None
    """On failure: why."""
    detail: Annotated[StrictStr, Field(max_length=1000)] | None = None
    """On failure: what the chat may tell its user (no paths: the system peer's log has them)."""

    @model_validator(mode="after")
    def _check_outcome(self) -> Self:
        if self.success and (self.status is None or self.error is not None):
            raise ValueError("a successful spawn_result has a status and no error")
        if not self.success and (self.error is None or self.status is not None):
            raise ValueError("a failed spawn_result has an error and no status")
        return self


class RouteAssigned(_Content):
    """``route_assigned``, system -> the chat: from now on, talk to ``agent``."""

    chat: _ClientId
    """The chat being routed (the topic this is sent to)."""
    agent: _ClientId
    """The clientId of the agent that serves the chat, ``agent:<name>``."""


class Configure(_Content):
    """``configure``, chat -> its agent: send your replies to my messages to ``talkto``.

    The reference agent accepts only ``talkto`` equal to the sender: a chat may not point an
    agent at another chat.
    """

    talkto: _ClientId


class _Forwarded(_Content):
    """What the BCP gateway adds to a message it forwards with a sealed value's text in it
    (``bcp_forward``, docs/protocol.md): the text is a tainted reader's, to be read as data.

    .. versionadded:: 0.4
    """

    untrusted: StrictBool | None = None
    """``true`` on a message the gateway forwarded; absent on any other."""
    notice: Annotated[StrictStr, Field(max_length=MAX_TEXT)] | None = None
    provenance: dict[str, StrictStr] | None = None
    """``{"channel": "bcp:<c>:<r>", "reader": ...}``: where the sealed text came from."""


class TgMessage(_Forwarded):
    """``tg_message``, chat -> its agent: one message of the conversation."""

    text: _Text
    id: _Id | None = None
    """The chat's id for this message, the same on every retry (each retry has a new envelope
    ``messageId``): an agent that saw ``(from, id)`` before answers it again without acting
    twice."""


class TgReply(_Forwarded):
    """``tg_reply``, agent -> the chat: an answer."""

    text: _Text
    in_reply_to: _Id | None = None
    """The ``id`` of the ``tg_message`` it answers; the chat stops retrying that message."""


class ScheduledMessage(_Content):
    """``scheduled_message``, system -> an agent: one of its definition's ``cron_schedules``
    is due, the reason an agent acts without being asked.

    .. versionadded:: 0.2
    """

    message: Annotated[StrictStr, Field(min_length=1, max_length=2000)]
    """The schedule's ``message``: what to do now."""
    schedule: Annotated[StrictStr, Field(min_length=1, max_length=2000)]
    """The cron expression that fired."""
    at: AwareDatetime
    """The scheduled time (UTC) it fired for; an agent that gets the same ``at`` twice (a
    resend) acts once."""
    label: Annotated[StrictStr, Field(min_length=1, max_length=2000)] | None = None


class AgentLifecycle(_Content):
    """``agent_event`` content the system peer publishes on ``system:agents``."""

    event: Literal["started", "exited"]
    agent: _AgentName
    pid: StrictInt
    returncode: StrictInt | None = None
    """For ``exited``: the exit status; negative: killed by that signal."""


CONTENT_MODELS: dict[str, type[BaseModel]] = {
    "spawn_request": SpawnRequest,
    "spawn_result": SpawnResult,
    "route_assigned": RouteAssigned,
    "configure": Configure,
    "tg_message": TgMessage,
    "tg_reply": TgReply,
    "scheduled_message": ScheduledMessage,
}
"""The content model of each chat ``type``: ``CONTENT_MODELS[type].model_validate(content)``."""
