"""deploy/: the Dockerfile, the compose file and the systemd unit, checked without docker or
systemd running: each command they start is one the CLI accepts, they agree with each other on
ports, paths and user, and the container's command serves and is healthy in an empty
directory."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from configparser import ConfigParser
from pathlib import Path

import pytest
import yaml

from bus import cli as bus_cli
from peers.cli import add_commands, gateway_beside
from peers.testing import scaled

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
BCPBUS = str(Path(sys.executable).with_name("bcpbus"))


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    found = []
    for line in lines:
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            found.append((instruction.upper(), rest.strip()))
    return found


def last(instruction: str) -> str:
    return [rest for name, rest in dockerfile() if name == instruction][-1]


def parse(argv: list[str]) -> object:
    """What `bcpbus ARGV` would run with; SystemExit (argparse's refusal) fails the test."""
    parser = bus_cli._parser(add_commands, gateway_beside)
    return parser.parse_args(argv)


def image_env() -> dict[str, str]:
    """The variables the Dockerfile's ENV instructions set."""
    found = {}
    for name, rest in dockerfile():
        if name == "ENV":
            found.update(item.split("=", 1) for item in shlex.split(rest))
    return found


KEY_VOLUME = "/var/lib/bcpbus-key"
"""Where the image keeps the checkpoints' signing key: a volume apart from the data."""


def container_command() -> list[str]:
    entrypoint = json.loads(last("ENTRYPOINT"))
    assert entrypoint == ["bcpbus"]  # exec form: bcpbus is PID 1 and gets SIGTERM
    return json.loads(last("CMD"))


def test_the_image_installs_the_package_and_runs_serve_as_a_user_on_all_interfaces():
    """The Dockerfile starts from a slim Python, copies every package the wheel is built from,
    installs the http extra, drops root, keeps state in a volume that is its working
    directory, and its command is `serve` on 0.0.0.0 with the HTTP binding its health check
    asks."""
    instructions = dockerfile()
    assert re.fullmatch(r"python:3\.1[1-9]-slim", last("FROM"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dirs = project["tool"]["setuptools"]["package-dir"]
    tops = {package_dirs.get(p, p).split(".")[0] for p in project["tool"]["setuptools"]["packages"]}
    copied = {rest.split()[0] for name, rest in instructions if name == "COPY"}
    assert tops <= copied, f"not copied into the image: {tops - copied}"
    assert any(name == "RUN" and "pip install '.[http]'" in rest for name, rest in instructions)
    user = last("USER")
    assert user not in ("root", "0") and instructions.index(("USER", user)) > max(
        i for i, (name, _) in enumerate(instructions) if name == "RUN"
    )
    assert json.loads(last("VOLUME")) == [last("WORKDIR"), KEY_VOLUME]
    assert last("WORKDIR") == "/var/lib/bcpbus"
    # serve makes its default signing key under $XDG_CONFIG_HOME: the key volume, made the
    # user's (a fresh named volume copies the owner and mode of the image's directory).
    assert image_env()["XDG_CONFIG_HOME"] == KEY_VOLUME
    assert f"install -d -o {user} -g {user} -m 0700 {KEY_VOLUME}" in " ".join(
        rest for name, rest in instructions if name == "RUN"
    )
    args = parse(container_command())
    assert args.command is bus_cli._serve and args.host == "0.0.0.0"
    assert {str(args.port), str(args.http_port)} == set(last("EXPOSE").split())
    assert f"127.0.0.1:{args.http_port}/healthz" in last("HEALTHCHECK")


def test_compose_runs_that_image_with_its_volume_and_ports():
    """compose.yaml loads, builds deploy/Dockerfile from the root, runs a command the CLI
    accepts, mounts a named volume on the image's volume and publishes the command's ports."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    (name, service), *others = compose["services"].items()
    assert others == [], "a single bus (a cluster extends this file)"
    build = service["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DEPLOY / "Dockerfile"
    args = parse(service["command"])
    assert args.command is bus_cli._serve and args.host == "0.0.0.0"
    published = {port.rsplit(":", 1)[1] for port in service["ports"]}
    assert published == {str(args.port), str(args.http_port)}
    mounts = dict(reversed(volume.split(":")) for volume in service["volumes"])
    assert set(mounts) == {last("WORKDIR"), KEY_VOLUME}
    assert set(mounts.values()) == set(compose["volumes"]) and len(compose["volumes"]) == 2
    assert service["cap_drop"] == ["ALL"] and service["read_only"] is True


def service_commands() -> list[list[str]]:
    """The `bcpbus` arguments of each command in docs/operators.md's "Run it as a service"
    blocks: what follows `run --rm bus` in a compose line, or the installed `bin/bcpbus`."""
    text = (ROOT / "docs" / "operators.md").read_text()
    section = text.split("## Run it as a service", 1)[1].split("\n## ", 1)[0]
    found = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:4] == ["docker", "compose", "-f", "deploy/compose.yaml"]:
                assert (ROOT / argv[3]).is_file()
                if argv[4] == "run":
                    assert argv[5:7] == ["--rm", "bus"], line  # the compose file's one service
                    found.append(argv[7:])
            elif argv[-1:] != ["bcpbus"] and "/opt/bcpbus/bin/bcpbus" in argv:
                found.append(argv[argv.index("/opt/bcpbus/bin/bcpbus") + 1 :])
            elif argv[:1] == ["cp"]:
                assert (ROOT / argv[1]).is_file(), line
    return found


def test_the_service_commands_the_operators_guide_shows_are_ones_the_cli_takes():
    """Docker and systemd do not run here: each bcpbus command the guide has an operator type
    through them (peers add, audit, init) parses with the real command line, and the files it
    names exist."""
    commands = service_commands()
    assert [argv[:2] for argv in commands] == [
        ["peers", "add"],
        ["audit", "--limit"],
        ["audit", "verify"],
        ["init", "/var/lib/bcpbus"],
        ["audit", "keygen"],
    ]
    for argv in commands:
        parse(argv)
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert list(compose["services"]) == ["bus"]


def unit() -> ConfigParser:
    config = ConfigParser(strict=False, interpolation=None)
    config.optionxform = str  # type: ignore[assignment,method-assign]
    config.read_string((DEPLOY / "bcpbus.service").read_text())
    return config


def test_the_systemd_unit_runs_serve_hardened_in_its_state_directory():
    """ExecStart is `bcpbus serve` with options the CLI accepts and its config in the state
    directory; the unit drops privileges and locks the filesystem down."""
    service = unit()["Service"]
    program, *argv = shlex.split(service["ExecStart"])
    assert program.endswith("/bin/bcpbus")
    args = parse(argv)
    assert args.command is bus_cli._serve
    state = f"/var/lib/{service['StateDirectory']}"
    assert str(args.config).startswith(state + "/") and service["WorkingDirectory"] == state
    assert service.get("User") == "bcpbus" or service.get("DynamicUser") == "yes"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
        "UMask": "0077",
    }.items():
        assert service[key] == value, key
    assert service["ExecReload"].endswith("kill -HUP $MAINPID")
    # The signing key is a credential (%d, only this service reads it) loaded from outside
    # the state directory, so a copy of that directory cannot sign a forged log.
    name, source = service["LoadCredential"].split(":")
    assert args.signing_key == f"%d/{name}" and not source.startswith(state + "/")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    """`systemd-analyze verify` accepts the unit without a warning (the program path pointed
    at this installation's bcpbus, which verify requires to exist)."""
    text = (DEPLOY / "bcpbus.service").read_text().replace("/opt/bcpbus/bin/bcpbus", BCPBUS)
    (tmp_path / "bcpbus.service").write_text(text)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "bcpbus.service")],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_the_container_command_serves_and_is_healthy_in_an_empty_volume(tmp_path):
    """The image's command, run in an empty directory as in a fresh volume (ports 0 instead
    of its fixed ones) with the image's environment and the user's home there, listens,
    answers the health check's request, and exits 0 on SIGTERM; its signing key is made in
    the key volume, never in the data volume, and its checkpoints verify."""
    argv = container_command()
    argv[argv.index("--port") + 1] = "0"
    argv[argv.index("--http-port") + 1] = "0"
    data, keys = tmp_path / "data", tmp_path / "key-volume"
    data.mkdir()
    keys.mkdir(mode=0o700)
    env = {**os.environ, **image_env(), "HOME": str(data), "PYTHONUNBUFFERED": "1"}
    env["XDG_CONFIG_HOME"] = env["XDG_CONFIG_HOME"].replace(KEY_VOLUME, str(keys))
    process = subprocess.Popen(
        [BCPBUS, *argv],
        cwd=data,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("listening on ws://0.0.0.0:")
        http = process.stdout.readline().strip().removeprefix("http on ")
        port = http.rsplit(":", 1)[1]
        check = json.loads(last("HEALTHCHECK").partition("CMD ")[2])
        check = [part.replace(":8080/", f":{port}/") for part in check]
        check[0] = sys.executable if check[0] == "python" else check[0]
        assert subprocess.run(check, timeout=scaled(30)).returncode == 0
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=scaled(30))
    assert process.returncode == 0, err
    assert (data / "bcpbus.db").is_file()
    assert "activity log's directory" not in err
    assert [p.name for p in data.rglob("*.key")] == []
    [key] = keys.rglob("signing.key")
    verified = subprocess.run(
        [BCPBUS, "audit", "verify", "--pubkey", f"{key}.pub"],
        cwd=data,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert verified.returncode == 0 and "checkpoints verify" in verified.stdout, verified.stdout
