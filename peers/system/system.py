"""The system peer (``agent:system``): starts agents for chats and routes the chats to them.

On a ``spawn_request {agent}`` from a chat on ``system:spawn``, it answers the delivery at once
and then:

1. starts the agent unless it is running: reads the agent definitions again (an edit takes
   effect at the next request), takes the definition's ``command:``, gets the agent's token from
   its :class:`~peers.system.tokens.TokenSource`, and runs the command in the definition's folder
   with ``BCPBUS_URL``, ``BCPBUS_CLIENT_ID``, ``BCPBUS_TOKEN``, ``BCPBUS_AGENT`` and
   ``BCPBUS_AGENT_FILE`` in its environment (the token never on a command line, where every
   user of the machine could read it);
2. answers ``spawn_result`` (``correlationId``: the request's ``messageId``) to the chat;
3. on success sends ``route_assigned {chat, agent}`` to the chat.

The definition's ``model``, ``tools`` and ``network`` reach the command too, as
``BCPBUS_AGENT_MODEL`` (absent when the definition names none), ``BCPBUS_AGENT_TOOLS`` (the
tool names joined by commas) and ``BCPBUS_AGENT_NETWORK``: the agent program applies them, since
neither the bus nor this peer can choose a model or cut a network for it (docs/bootstrap.md).

At each time one of a definition's ``cron_schedules`` names (:mod:`peers.system.schedule`), it
starts the agent if it has a ``command:`` and is not running, then sends it a
``scheduled_message`` on ``agent:<name>``, again until the agent takes it or
:data:`SCHEDULE_WINDOW` has passed (a starting agent takes a moment to connect).

One process per agent definition, shared by the chats routed to it: the bus gives
``agent:<name>`` the roles and taint of its definition, so an agent never runs under another
name. An agent that exits is reported (``exited``, and an ``agent_event`` on ``system:agents`` for
the activity log) and started again by the next ``spawn_request`` for it. :meth:`close` stops
every agent it started.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from schemas.agents import AgentDefinition, DefinitionError, load_agents
from schemas.chat import (
    AGENTS_TOPIC,
    SPAWN_TOPIC,
    SYSTEM_CLIENT_ID,
    AgentLifecycle,
    RouteAssigned,
    ScheduledMessage,
    SpawnError,
    SpawnRequest,
    SpawnResult,
)
from schemas.common import agent_id

from ..client import Message, Peer, Reply, backoff
from ..errors import PeerError
from ..tokens import TOKEN_ENV
from .schedule import Clock, Due, Scheduler
from .supervisor import Child, Supervisor
from .tokens import NoToken, TokenSource

__all__ = ["SCHEDULE_WINDOW", "SystemPeer", "agent_argv"]

Out = Callable[[dict[str, Any]], None]

SCHEDULE_WINDOW = 60.0
"""Seconds a ``scheduled_message`` is sent again while no peer takes it."""


def agent_argv(command: Sequence[str], python: str = sys.executable) -> list[str]:
    """The argv that runs a definition's ``command``: a first word ``python`` is ``python``,
    the interpreter that runs ``bcpbus``, so an agent written in Python gets the same
    installation."""
    argv = list(command)
    if argv and argv[0] == "python":
        argv[0] = python
    return argv


class SystemPeer:
    """Answers spawn requests on ``peer`` (``agent:system``) from the definitions in
    ``agents_dir``.

    Args:
        peer: the connection, not yet connected; handlers are registered here.
        agents_dir: the agent definitions; give the bus the same folder, since the bus
            takes each agent's taint and roles from it.
        tokens: where agents' tokens come from.
        out: receives each event (``ready``, ``started``, ``spawn_refused``, ``output``,
            ``exited``, ``scheduled``, ``schedule_failed``...).
        stop_timeout: seconds each agent has to exit on :meth:`close` before it is killed.
        clock: the time ``cron_schedules`` are read against; the machine's by default.
    """

    def __init__(
        self,
        peer: Peer,
        agents_dir: str | os.PathLike[str],
        tokens: TokenSource,
        *,
        out: Out,
        stop_timeout: float = 5.0,
        clock: Clock | None = None,
    ) -> None:
        self.peer = peer
        self.agents_dir = Path(agents_dir)
        self.tokens = tokens
        self.out = out
        self.supervisor = Supervisor(
            on_output=self._on_output, on_exit=self._on_exit, stop_timeout=stop_timeout
        )
        # One lock for every start, not one per name: names come from chats, and starting a
        # process takes milliseconds.
        self._starting = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.scheduler = Scheduler(
            lambda: load_agents(self.agents_dir), self._on_schedule, clock=clock
        )
        peer.handle("spawn_request", self._on_spawn_request)

    async def start(self) -> None:
        """Check the definitions, connect, subscribe to ``system:spawn``.

        Raises:
            DefinitionError: the agent definitions do not load.
            PeerError: the bus cannot be reached or refused the peer.
        """
        load_agents(self.agents_dir)
        await self.peer.connect()
        await self.peer.subscribe(SPAWN_TOPIC)
        self.scheduler.start()
        self.out({"event": "ready", "client_id": self.peer.client_id, "topic": SPAWN_TOPIC})

    async def close(self) -> None:
        """Stop the schedules and every agent started, finish sending, disconnect. Idempotent."""
        await self.scheduler.close()
        for task in self._tasks:
            task.cancel()  # a scheduled message still being offered
        await self.supervisor.close()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5)
        await self.peer.close()

    # Spawning

    async def _on_spawn_request(self, message: Message) -> Reply:
        try:
            request = SpawnRequest.model_validate(message.content)
        except ValidationError:
            return Reply(False, "invalid", "spawn_request content is {agent: name}")
        # Answer the delivery now and start the agent afterwards: the chat's sendMessage
        # should not wait for a process to start.
        self._later(self._spawn(message.sender, message.message_id, request.agent))
        return Reply(True, "accepted")

    async def _spawn(self, chat: str, request_id: str, name: str) -> None:
        async with self._starting:
            result = await self._ensure_running(name)
        await self._send(chat, "spawn_result", result, correlation_id=request_id)
        if result.success:
            route = RouteAssigned(chat=chat, agent=agent_id(name))
            await self._send(chat, "route_assigned", route, correlation_id=request_id)

    async def _ensure_running(self, name: str) -> SpawnResult:
        if self.supervisor.running(name) is not None:
            return SpawnResult(agent=name, success=True, status="running")
        try:
            definition = self._definition(name)
            token = self.tokens.token_for(agent_id(name))
        except _Refusal as refusal:
            return self._refuse(name, refusal.error, refusal.detail)
        except NoToken as exc:
            return self._refuse(name, SpawnError.NO_TOKEN, str(exc))
        assert definition.command is not None  # _definition checked it
        argv = agent_argv(definition.command)
        try:
            child = await self.supervisor.start(
                name, argv, env=self._environment(definition, token), cwd=self._folder(definition)
            )
        except OSError as exc:
            return self._refuse(name, SpawnError.START_FAILED, f"{argv[0]}: {exc.strerror or exc}")
        self.out({"event": "started", "agent": name, "pid": child.pid})
        self._later(self._lifecycle(AgentLifecycle(event="started", agent=name, pid=child.pid)))
        return SpawnResult(agent=name, success=True, status="started")

    def _definition(self, name: str) -> AgentDefinition:
        if agent_id(name) == SYSTEM_CLIENT_ID:
            raise _Refusal(SpawnError.NOT_SPAWNABLE, f"{SYSTEM_CLIENT_ID} is this peer")
        try:
            definition = load_agents(self.agents_dir).get(name)
        except (DefinitionError, OSError) as exc:
            raise _Refusal(SpawnError.DEFINITION_ERROR, str(exc)) from exc
        if definition is None:
            raise _Refusal(SpawnError.UNKNOWN_AGENT, f"no agent {name!r} in {self.agents_dir}")
        if definition.command is None:
            raise _Refusal(SpawnError.NOT_SPAWNABLE, f"{definition.source} has no command:")
        return definition

    def _environment(self, definition: AgentDefinition, token: str) -> dict[str, str]:
        env = {
            **{key: value for key, value in os.environ.items() if key != "BCPBUS_AGENT_MODEL"},
            "BCPBUS_URL": self.peer.url,
            "BCPBUS_CLIENT_ID": agent_id(definition.name),
            TOKEN_ENV: token,  # replaces this peer's own token, if it came the same way
            "BCPBUS_AGENT": definition.name,
            "BCPBUS_AGENT_FILE": str(Path(definition.source).resolve()),
            "BCPBUS_AGENT_TOOLS": ",".join(definition.tools),
            "BCPBUS_AGENT_NETWORK": definition.network,
        }
        if definition.model is not None:
            env["BCPBUS_AGENT_MODEL"] = definition.model
        return env

    def _folder(self, definition: AgentDefinition) -> Path:
        return Path(definition.source).parent

    def _refuse(self, name: str, error: SpawnError, detail: str) -> SpawnResult:
        # The operator reads the detail here; the chat gets a fixed text without paths.
        self.out({"event": "spawn_refused", "agent": name, "error": error.value, "detail": detail})
        public = _PUBLIC_DETAIL[error].format(client_id=agent_id(name))
        return SpawnResult(agent=name, success=False, error=error, detail=public)

    # Schedules

    def _on_schedule(self, due: Due) -> None:
        self._later(self._send_scheduled(due))

    async def _send_scheduled(self, due: Due) -> None:
        event = {"agent": due.agent, "schedule": due.schedule.schedule, "at": due.at.isoformat()}
        if self._spawnable(due.agent):
            async with self._starting:
                started = await self._ensure_running(due.agent)
            if not started.success:
                self.out({"event": "schedule_failed", **event, "error": str(started.error)})
                return
        content = ScheduledMessage(
            message=due.schedule.message,
            schedule=due.schedule.schedule,
            at=due.at,
            label=due.schedule.label,
        ).model_dump(mode="json", exclude_none=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SCHEDULE_WINDOW
        for delay in backoff(initial=0.2, maximum=5.0):
            try:
                result = await self.peer.send(agent_id(due.agent), "scheduled_message", content)
                if result.delivered_to >= 1:
                    self.out({"event": "scheduled", **event})
                    return
            except PeerError as exc:
                error = str(exc)
            else:
                error = "no peer took it"
            if loop.time() + delay > deadline:
                self.out({"event": "schedule_failed", **event, "error": error})
                return
            await asyncio.sleep(delay)  # the agent is starting: offer it again

    def _spawnable(self, name: str) -> bool:
        try:
            definition = load_agents(self.agents_dir).get(name)
        except (DefinitionError, OSError):
            return False
        return definition is not None and definition.command is not None

    # What the agents do

    def _on_output(self, name: str, line: str) -> None:
        self.out({"event": "output", "agent": name, "line": line})

    def _on_exit(self, child: Child, code: int) -> None:
        self.out({"event": "exited", "agent": child.name, "pid": child.pid, "returncode": code})
        event = AgentLifecycle(event="exited", agent=child.name, pid=child.pid, returncode=code)
        self._later(self._lifecycle(event))

    async def _lifecycle(self, event: AgentLifecycle) -> None:
        await self._send(AGENTS_TOPIC, "agent_event", event)

    # Sending

    async def _send(
        self,
        topic: str,
        message_type: str,
        content: BaseModel,
        *,
        correlation_id: str | None = None,
    ) -> None:
        body = content.model_dump(mode="json", exclude_none=True)
        try:
            await self.peer.send(topic, message_type, body, correlation_id=correlation_id)
        except PeerError as exc:
            # The chat asks again when it hears nothing: it owns the retries.
            self.out({"event": "send_failed", "type": message_type, "to": topic, "error": str(exc)})

    def _later(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


_PUBLIC_DETAIL = {
    SpawnError.UNKNOWN_AGENT: "no agent definition names {client_id}",
    SpawnError.NOT_SPAWNABLE: "{client_id} is not started on request",
    SpawnError.NO_TOKEN: "no token is provided for {client_id}; the operator must add one",
    SpawnError.START_FAILED: "{client_id} could not be started; the operator has the reason",
    SpawnError.DEFINITION_ERROR: "the agent definitions do not load; the operator has the reason",
}


class _Refusal(Exception):
    def __init__(self, error: SpawnError, detail: str) -> None:
        super().__init__(error, detail)
        self.error = error
        self.detail = detail
