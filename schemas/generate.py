"""Write the JSON Schema of every wire object into ``schemas/json/``, one file per object.

Peers in other languages read these files; the pydantic models in :mod:`schemas` are the source,
so regenerate after changing a model and commit the result::

    python -m schemas.generate            # rewrite schemas/json/
    python -m schemas.generate --check    # exit 1 and list the files that are stale

Files are named after the wire: the JSON-RPC frames (``jsonrpc.request.json``, ...), each bus
method's params and result (``initialize.params.json``, ``sendMessage.result.json``), the payload
envelope (``envelope.json``), the content of each presence event (``peer_joined.json``), the
content of each BCP message type (``bcp_query.json``) and of each chat type
(``spawn_request.json``), the frontmatter of an agent definition (``agent_definition.json``),
the risk report of ``bcpbus agents check --json`` (``agents_check.json``), and the HTTP
binding's bodies (``http.*.json``; the bus serves its OpenAPI document at
``/openapi.json``). The output is deterministic (sorted keys, two-space indent, a trailing
newline), so ``--check`` compares text.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel

from schemas import bcp, bus, chat, http, jsonrpc
from schemas.agents import AgentDefinition
from schemas.risk import RiskReport

__all__ = ["DEFAULT_DIRECTORY", "MODELS", "check", "render", "write"]

DEFAULT_DIRECTORY: Final = Path(__file__).resolve().parent / "json"
"""Where the committed schema files live."""

JSON_SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"

MODELS: Final[Mapping[str, type[BaseModel]]] = {
    # JSON-RPC 2.0 frames, in both directions.
    "jsonrpc.request": jsonrpc.Request,
    "jsonrpc.notification": jsonrpc.Notification,
    "jsonrpc.response": jsonrpc.Response,
    "jsonrpc.error": jsonrpc.ErrorResponse,
    # Bus methods: params and result of each.
    "initialize.params": bus.InitializeParams,
    "initialize.result": bus.InitializeResult,
    "subscribe.params": bus.SubscribeParams,
    "subscribe.result": bus.SubscribeResult,
    "unsubscribe.params": bus.UnsubscribeParams,
    "unsubscribe.result": bus.SubscribeResult,
    "listSubscriptions.result": bus.ListSubscriptionsResult,
    "fetchMessages.params": bus.FetchMessagesParams,
    "fetchMessages.result": bus.FetchMessagesResult,
    "sendMessage.params": bus.SendMessageParams,
    "sendMessage.result": bus.SendMessageResult,
    "ping.result": bus.PingResult,
    "listPeers.result": bus.ListPeersResult,
    "processMessage.params": bus.ProcessMessageParams,
    "processMessage.result": bus.ProcessMessageResult,
    # The payload of every sendMessage and processMessage.
    "envelope": bus.Envelope,
    # The content of each presence event the bus publishes on system:presence.
    **bus.PRESENCE_MODELS,
    # The content of the bus's delivery_status message (a webhook delivery that failed).
    bus.DELIVERY_STATUS_TYPE: bus.DeliveryStatus,
    # The HTTP binding's bodies; the bus serves them together as /openapi.json.
    "http.postMessage": http.PostMessage,
    "http.accepted": http.Accepted,
    "http.error": http.ErrorBody,
    "http.discovery": http.Discovery,
    "http.messagesPage": http.MessagesPage,
    # The content of each BCP message type.
    **bcp.CONTENT_MODELS,
    # The content of each chat and agent type of the bootstrap flow (what the reference peers
    # send; the bus checks only their envelope).
    **chat.CONTENT_MODELS,
    # Agent definitions: the YAML frontmatter of agents/*.md.
    "agent_definition": AgentDefinition,
    # The risk report of `bcpbus agents check --json` (a tool's input, not a wire object).
    "agents_check": RiskReport,
}
"""Schema name (the file name without ``.json``) -> the model it is generated from."""


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """Return the JSON Schema (draft 2020-12) of ``model`` with its wire (camelCase) names."""
    return {"$schema": JSON_SCHEMA_DIALECT, **model.model_json_schema(by_alias=True)}


def render() -> dict[str, str]:
    """Return the text of every schema file by file name, exactly as it is written."""
    return {
        f"{name}.json": json.dumps(schema_of(model), indent=2, sort_keys=True, ensure_ascii=False)
        + "\n"
        for name, model in MODELS.items()
    }


def write(directory: Path = DEFAULT_DIRECTORY) -> dict[str, str]:
    """Write every schema file into ``directory`` and delete ``*.json`` files no model makes.

    Returns:
        What changed, as :func:`check` reports it before the write.
    """
    changes = check(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = render()
    for name in changes:
        path = directory / name
        if name in files:
            path.write_text(files[name], encoding="utf-8")
        else:
            path.unlink()
    return changes


def check(directory: Path = DEFAULT_DIRECTORY) -> dict[str, str]:
    """Compare ``directory`` with a fresh generation.

    Returns:
        File name -> ``missing``, ``stale`` (its text differs) or ``extra`` (no model makes
        it), sorted by name; empty when the folder is up to date.
    """
    files = render()
    problems: dict[str, str] = {}
    for name, text in files.items():
        path = directory / name
        if not path.is_file():
            problems[name] = "missing"
        elif path.read_text(encoding="utf-8") != text:
            problems[name] = "stale"
    if directory.is_dir():
        for path in directory.glob("*.json"):
            if path.name not in files:
                problems[path.name] = "extra"
    return dict(sorted(problems.items()))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m schemas.generate",
        description="Write the JSON Schema files of every bcpbus wire object.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and list the files that differ from the models",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_DIRECTORY,
        metavar="DIR",
        help=f"the schema folder (default: {DEFAULT_DIRECTORY})",
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = check(args.out)
        for name, problem in problems.items():
            print(f"{args.out / name}: {problem}", file=sys.stderr)
        if problems:
            print("regenerate them with: python -m schemas.generate", file=sys.stderr)
            return 1
        return 0
    for name, change in write(args.out).items():
        print(f"{args.out / name}: {'deleted' if change == 'extra' else 'written'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
