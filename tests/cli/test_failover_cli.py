"""The terminal tools given several buses: `sub` fails over when its bus stops, real processes."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess

from peers.testing import scaled
from tests.cli.test_operators import BCPBUS, arun
from tests.cli.test_sub_reconnect import ENV, bus_on, free_port, next_line


async def test_sub_fails_over_to_the_next_bus_and_pub_skips_a_dead_one(tmp_path):
    """`sub --url A --url B` moves to B when A stops and still prints what is sent there;
    `pub --url DEAD,B` reaches B past a URL where nothing listens."""
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    for client_id, file in (("agent:w1", "w1.token"), ("tg:42", "tg42.token")):
        code, out, err = await arun("peers", "add", client_id, cwd=first)
        assert code == 0, err
        (first / file).write_text(out)
    shutil.copytree(first, second)  # one peers file, as nodes that share it have
    url_a, url_b = (f"ws://127.0.0.1:{free_port()}" for _ in range(2))
    dead = f"ws://127.0.0.1:{free_port()}"
    async with bus_on(second, int(url_b.rsplit(":", 1)[1])):
        async with bus_on(first, int(url_a.rsplit(":", 1)[1])) as bus_a:
            sub = await asyncio.create_subprocess_exec(
                BCPBUS,
                *("sub", "agent:w1", "--url", url_a, "--url", url_b),
                *("--as", "agent:w1", "--token-file", "w1.token"),
                cwd=first,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=ENV,
            )
            assert sub.stdout is not None and sub.stderr is not None
            try:
                assert (await next_line(sub.stderr)).startswith("bcpbus: subscribed to agent:w1")
                bus_a.send_signal(signal.SIGTERM)
                lost = await next_line(sub.stderr)
                assert lost.startswith(f"bcpbus: connection to {url_a} lost"), lost
            except BaseException:
                sub.kill()
                raise
        try:
            back = await next_line(sub.stderr)
            assert back.startswith(f"bcpbus: reconnected to {url_b}"), back
            code, _, err = await arun(
                "pub",
                *("agent:w1", "tg_message", json.dumps({"text": "on b"})),
                *("--url", f"{dead},{url_b}", "--as", "tg:42", "--token-file", "tg42.token"),
                cwd=second,
            )
            assert code == 0, err
            printed = json.loads(await next_line(sub.stdout))
            assert printed["payload"]["content"] == {"text": "on b"}
        finally:
            sub.kill()
            async with asyncio.timeout(scaled(30)):
                await sub.wait()
