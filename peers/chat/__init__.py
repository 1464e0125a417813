"""The reference chat peer of the bootstrap flow (``bcpbus chat``).

:class:`Chat` asks the system peer for an agent, configures it and talks to it, retrying each
message until the agent answers; :class:`ChatStore` keeps the route, the retry queue and the
history in the chat's own SQLite file. See docs/bootstrap.md.
"""

from .chat import Chat, RetrySettings
from .store import ChatStore, OutboxItem, Route, StoreError

__all__ = ["Chat", "ChatStore", "OutboxItem", "RetrySettings", "Route", "StoreError"]
