"""``python -m bench SCENARIO [--quick] [--json OUT]``: run a benchmark and print its table.

Scenarios: ``delivery`` (1 and 2: the bus and the baseline relay, interleaved), ``bcp`` (3),
``fanout`` (4), ``connections`` (5), ``log`` (6), ``http`` (8: HTTP POST against WebSocket
sendMessage), ``fetch`` (11: reading messages back by epoch), ``all`` of those, or ``soak`` (7,
ten minutes unless ``--duration`` says otherwise, so it runs only when named); the numbers work
too.
``containment`` (9, only when named) runs public prompt-injection corpora and ordinary texts
through the gateway's validation (``--limit N`` samples per corpus, ``--bus-sample N``).
``verify`` (10, only when named) times ``bcpbus audit verify`` over 1,000,000 rows.
``cluster`` (12, only when named: it needs nats-server) runs 1, 2 and 3 bus nodes on NATS
against NATS request/reply alone.
``python -m bench worker ROLE PARAMS_FILE`` is how the scenarios start their child processes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from .common import machine, machine_line, raise_fd_limit

SCENARIOS = ("delivery", "bcp", "fanout", "connections", "log", "http", "fetch")
LONG_SCENARIOS = ("soak", "verify", "cluster")
"""Run only when named: too long for ``all``."""
MEASURES = ("containment",)
"""Run only when named: what the gateway lets through, not how fast the bus is."""
_ALIASES = {
    "1": "delivery",
    "2": "delivery",
    "3": "bcp",
    "4": "fanout",
    "5": "connections",
    "6": "log",
    "7": "soak",
    "8": "http",
    "9": "containment",
    "10": "verify",
    "11": "fetch",
    "12": "cluster",
}

# Worker roles: name -> "module:function", each ``async def role(params: dict) -> None``.
ROLES = {
    "relay": "bench.relay:main",
    "publisher": "bench.clients:publisher",
    "subscribers": "bench.clients:subscribers",
    "controller": "bench.bcp:controller",
    "reader": "bench.bcp:reader",
    "idlers": "bench.connections:idlers",
    "log": "bench.log:writer",
    "soakers": "bench.soak:soakers",
    "misbehavers": "bench.soak:misbehavers",
    "http_publisher": "bench.http:publisher",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["worker"]:
        return _worker(args[1], json.loads(Path(args[2]).read_text()))
    options = _parser().parse_args(args)
    raise_fd_limit()
    names = SCENARIOS if options.scenario == "all" else (_name(options.scenario),)
    info = machine()
    print(f"machine: {machine_line(info)}", flush=True)
    results: dict[str, Any] = {"machine": info, "quick": options.quick, "scenarios": {}}
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        print(f"\n## {name}{' (quick)' if options.quick else ''}", flush=True)
        started = time.monotonic()
        settings = module.options(options.quick, options.loop)
        overrides = {
            "reps": options.reps,
            "peers": options.peers,
            "duration": options.duration,
            "limit": options.limit,
            "bus_sample": options.bus_sample,
            "action": options.action,
            "transport": options.transport,
            "window": options.window,
        }
        fields = {field.name for field in dataclasses.fields(settings)}
        settings = dataclasses.replace(
            settings, **{k: v for k, v in overrides.items() if v is not None and k in fields}
        )
        result = asyncio.run(module.run(settings))
        result["seconds"] = time.monotonic() - started
        result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        results["scenarios"][name] = result
        print(
            f"\n{module.report(result)}\n({result['seconds']:.0f} s; load average "
            f"{result['loadavg_after'][0]:.2f} at the end)",
            flush=True,
        )
    if options.json is not None:
        options.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {options.json}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "scenario", choices=(*SCENARIOS, *LONG_SCENARIOS, *MEASURES, *_ALIASES, "all")
    )
    parser.add_argument("--quick", action="store_true", help="a tiny load: checks it runs")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the results here")
    parser.add_argument("--reps", type=int, metavar="N", help="repetitions (default per scenario)")
    parser.add_argument("--peers", type=int, metavar="N", help="peers (soak, connections)")
    parser.add_argument("--duration", type=float, metavar="S", help="seconds of load (soak)")
    parser.add_argument("--limit", type=int, metavar="N", help="samples per corpus (containment)")
    parser.add_argument(
        "--window", type=int, metavar="N", help="requests in flight per publisher (cluster)"
    )
    parser.add_argument(
        "--bus-sample", type=int, metavar="N", help="answers sent over the bus (containment)"
    )
    parser.add_argument(
        "--action",
        choices=("reject", "review", "flag"),
        help="anomaly_action instead of the reference channel's (containment)",
    )
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop of the server processes (uvloop must be installed)",
    )
    parser.add_argument(
        "--transport",
        choices=("websockets", "picows"),
        help="what serves the bus's peers (delivery, connections; picows needs its extra)",
    )
    return parser


def _name(scenario: str) -> str:
    return _ALIASES.get(scenario, scenario)


def _worker(role: str, params: dict[str, Any]) -> int:
    module_name, function_name = ROLES[role].split(":")
    function: Callable[[dict[str, Any]], Coroutine[Any, Any, None]] = getattr(
        importlib.import_module(module_name), function_name
    )
    if params.get("loop") == "uvloop":
        import uvloop  # type: ignore[import-not-found,unused-ignore]

        uvloop.run(function(params))
    else:
        asyncio.run(function(params))
    return 0


if __name__ == "__main__":
    sys.exit(main())
