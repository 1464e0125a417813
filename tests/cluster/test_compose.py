"""deploy/compose.cluster.yaml, checked without docker: three nodes and a gateway whose commands
the CLI accepts, on one NATS server with JetStream, sharing one volume."""

from __future__ import annotations

import yaml

from bus import cli as bus_cli
from tests.test_deploy import DEPLOY, last, parse

COMPOSE = DEPLOY / "compose.cluster.yaml"


def test_the_cluster_compose_runs_three_nodes_and_one_gateway_on_jetstream():
    """Each node serves with --cluster on the nats service (run with -js), its own name and
    log, no gateway of its own; the one gateway lists every node; all share the volume that is
    the image's working directory, and the image is built with the cluster extra."""
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert "-js" in services["nats"]["command"]
    nodes = {name: parse(s["command"]) for name, s in services.items() if name in ("a", "b", "c")}
    assert len(nodes) == 3
    for name, args in nodes.items():
        assert args.command is bus_cli._serve and args.host == "0.0.0.0"
        assert (args.cluster, args.node, args.no_gateway) == ("nats://nats:4222", name, True)
        assert str(args.db) == f"{name}.db"
    published = sorted(port.split(":")[1] for name in nodes for port in services[name]["ports"])
    assert published == ["8765", "8766", "8767"]
    gateway = parse(services["gateway"]["command"])
    assert gateway.url.split(",") == [f"ws://{name}:{nodes[name].port}" for name in "abc"]
    for name in (*nodes, "gateway"):
        volume, target = services[name]["volumes"][0].split(":")
        assert volume in compose["volumes"] and target == last("WORKDIR")
    assert "nats-py" in services["a"]["build"]["dockerfile_inline"]
