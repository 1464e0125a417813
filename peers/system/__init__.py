"""The reference system peer of the bootstrap flow (``bcpbus system``, clientId ``agent:system``).

:class:`SystemPeer` answers ``spawn_request`` by starting the agent's ``command:`` under a
:class:`Supervisor`, with its token from a :class:`TokenSource`, and routes the chat to it. See
docs/bootstrap.md.
"""

from .supervisor import Child, Supervisor
from .system import SystemPeer, agent_argv
from .tokens import DirectoryTokens, EphemeralTokens, NoToken, TokenSource

__all__ = [
    "Child",
    "DirectoryTokens",
    "EphemeralTokens",
    "NoToken",
    "Supervisor",
    "SystemPeer",
    "TokenSource",
    "agent_argv",
]
