"""``bcpbus mcp``: any MCP host (a desktop assistant, a coding agent) as a bus peer.

- :mod:`peers.mcp.tools`: the tools, their descriptions and input models, by role (pure);
- :mod:`peers.mcp.shapes`: what a valid answer looks like, what a channel allows (pure);
- :mod:`peers.mcp.inbox`: what arrived that no tool call waited for;
- :mod:`peers.mcp.bridge`: the peer, its controller and reader, and each tool's work;
- :mod:`peers.mcp.server`: the MCP server on the ``mcp`` SDK, over stdio or streamable HTTP;
- :mod:`peers.mcp.command`: the ``bcpbus mcp`` command.

Only :mod:`peers.mcp.server` imports the optional ``mcp`` package, so ``bcpbus`` runs without it.
See docs/mcp.md.
"""

__all__: list[str] = []
