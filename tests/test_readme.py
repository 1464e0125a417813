"""The README's own-bus example runs as printed: its shell lines and its Python program, in
order, in an empty directory, with real processes.

The blocks are those with an ``<!-- example: own-bus -->`` comment right above them. One change
is made to them: the port 8765 becomes a free one (in the URLs, as ``--port`` on the ``serve``
line, and as ``$BCPBUS_URL`` for the terminal tools), so that the test never meets a bus
someone else runs. A shell line ending in ``&`` is started in the background and waited on
until it prints ``listening on``.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

from peers.testing import scaled

ROOT = Path(__file__).resolve().parents[1]
_MARKER = "<!-- example: own-bus -->"
_FENCE = re.compile(r"^```(\w*)\s*$")


def examples(text: str) -> list[tuple[str, str]]:
    """(language, text) of every fenced block that has the marker right above it."""
    lines = text.splitlines()
    blocks = []
    for index, line in enumerate(lines):
        if line.strip() != _MARKER:
            continue
        fence = _FENCE.match(lines[index + 1])
        assert fence, f"README.md:{index + 2}: the marker must sit right above a fence"
        end = lines.index("```", index + 2)
        blocks.append((fence.group(1), "\n".join(lines[index + 2 : end])))
    return blocks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_own_bus_example_runs_as_printed(tmp_path):
    """Every shell line succeeds, the Python program prints what the README says it prints,
    and the audit commands find its message."""
    blocks = examples((ROOT / "README.md").read_text(encoding="utf-8"))
    assert [lang for lang, _ in blocks] == ["sh", "python", "sh", "sh"]
    port = str(free_port())
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONUNBUFFERED": "1",
        "BCPBUS_URL": f"ws://127.0.0.1:{port}",  # the terminal tools' default --url
    }
    env.pop("BCPBUS_TOKEN", None)
    background: list[subprocess.Popen[str]] = []
    outputs: list[str] = []
    try:
        for lang, text in blocks:
            text = text.replace("8765", port)
            if lang == "python":
                outputs.append(_python(text, tmp_path, env))
                continue
            for line in text.splitlines():
                command = line.split("  #")[0].strip()
                if command.endswith("&"):
                    background.append(
                        _serve(command.removesuffix("&") + f" --port {port}", tmp_path, env)
                    )
                elif command:
                    outputs.append(_sh(command, tmp_path, env))
    finally:
        for process in background:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=scaled(30))  # reads and closes its stdout
    printed = outputs[2]
    assert "agent got {'text': 'hello'}" in printed
    assert "'accepted': True" in printed and "'deliveredTo': 1" in printed
    assert '"accepted": true' in outputs[3]  # bcpbus pub: agent:w1 has gone, deliveredTo 0
    assert "agent:w1" in outputs[4] and "send_finish" in outputs[4]
    assert "send_finish" in outputs[5] and "tg:42" in outputs[5]


def _sh(command: str, cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert result.returncode == 0, f"{command}: {result.stderr}"
    return result.stdout


def _python(program: str, cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-c", program],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _serve(command: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        ["bash", "-c", f"exec {command}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], scaled(30))
    line = process.stdout.readline() if ready else "(nothing in time)"
    assert line.startswith("listening on ws://"), line
    return process
