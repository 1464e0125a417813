"""The bus's memory under a flood of large messages, measured on a real ``bcpbus serve`` process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bench.common import rss_bytes
from bench.hostile import LARGE, large, login, serve, tokens_for
from peers.testing import scaled

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20
CAP = 24 * MIB
"""``max_inflight_bytes`` of the bus under test."""
SENDERS = 32
"""Each sends one message of :data:`bench.hostile.LARGE` characters: about 1.2x the cap."""
FIXED = 16 * MIB
"""What the bus may add whatever the cap: the frames being read (a quarter of it), a log batch
(4 MiB of content), the connections and SQLite's page cache. Once the flood is over, the bus
keeps at most this and a quarter of the cap: the heap that its connections and rows grew."""


async def test_flood_of_large_messages_stays_within_the_cap(tmp_path: Path) -> None:
    """Thirty-two peers sending 900 KiB each to a subscriber that never answers raise the bus's RSS
    by at most 1.5x its in-flight cap (plus fixed costs), each gets an answer or -32005, pings
    are answered throughout, and the memory goes back once the flood is over."""
    config = tmp_path / "bus.yaml"
    config.write_text(f"limits:\n  max_inflight_bytes: {CAP}\n  process_timeout: 2\n")
    ids = ["agent:stall", "tg:pinger", *(f"tg:flood{i}" for i in range(SENDERS))]
    tokens = tokens_for(tmp_path / "peers.yaml", ids)
    async with serve(ROOT, tmp_path, config) as (pid, url):
        pinger = await login(url, "tg:pinger", tokens.pop("tg:pinger"))
        baseline = rss_bytes(pid)
        seen: dict[str, int] = {}
        flood = asyncio.create_task(large(url, tokens, seen))
        peak, pings = baseline, 0
        async with asyncio.timeout(scaled(60)):
            while not flood.done():
                peak = max(peak, rss_bytes(pid))
                async with asyncio.timeout(scaled(5)):
                    await pinger.send(json.dumps({"jsonrpc": "2.0", "id": pings, "method": "ping"}))
                    assert "result" in json.loads(await pinger.recv())
                pings += 1
                await asyncio.wait({flood}, timeout=0.1)
        await flood
        assert sum(seen.values()) == SENDERS and set(seen) <= {"answered", "-32005"}, seen
        assert pings >= 3
        grew = (peak - baseline) / MIB
        assert grew <= (1.5 * CAP + FIXED) / MIB, (
            f"RSS grew {grew:.0f} MiB for a {CAP >> 20} MiB cap"
        )
        # What the flood held goes back to the system (bus.ops.memory), not only to the heap;
        # RSS has no event to wait on, so it is read every 0.2 s until it is down or time is up.
        for _ in range(int(scaled(15) / 0.2)):
            left = (rss_bytes(pid) - baseline) / MIB
            if left <= (FIXED + CAP // 4) / MIB:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError(f"RSS still {left:.0f} MiB above its baseline after the flood")
        await pinger.close()
    assert SENDERS * LARGE > CAP  # the flood is larger than the cap, or it proves nothing
