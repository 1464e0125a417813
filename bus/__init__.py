"""bcpbus: a JSON-RPC 2.0 message bus over WebSocket for the Bandwidth-Constrained Protocol.

The pieces, pure ones first: :mod:`bus.core.protocol` (sans-I/O JSON-RPC session),
:mod:`bus.core.topics`
(patterns and the subscription index), :mod:`bus.core.policy` (authorization),
:mod:`bus.ops.credentials`
(token hashes), :mod:`bus.log.activity` (the append-only SQLite log), :mod:`bus.server` (the
websockets shell), :mod:`bus.cli` (the ``bcpbus`` command).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
