"""Bits per channel over time: the running totals read from a real log, and the chart's lines."""

from __future__ import annotations

from bus.core.logevents import LogEvent
from bus.log.activity import ActivityLog
from peers.console.charts import History, Step, bits_history, draw


async def test_bits_history_keeps_every_step_of_each_channel(tmp_path):
    """Charges, refunds, deliveries and a budget reset add up per channel, in row order."""
    db = tmp_path / "log.db"
    async with ActivityLog(db) as log:
        rows = [
            ("bcp_bits_charged", {"bits": 10.0, "budget_bits": 100, "budget_left": 90}),
            ("bcp_delivered", {"bits": 6.5}),
            ("bcp_bits_charged", {"bits": -2.5, "budget_bits": 100, "budget_left": 92.5}),
            ("bcp_budget_reset", {}),
        ]
        for event, payload in rows:
            log.record(LogEvent(event), payload={"channel": "bcp:main:researcher", **payload})
        log.record(
            LogEvent.BCP_BITS_CHARGED, payload={"channel": "bcp:a:b", "bits": 1, "budget_left": 9}
        )
        log.record(LogEvent.BCP_BITS_CHARGED, payload_json="not json")
        await log.commit()
    a, main = bits_history(db)
    assert (a.channel, main.channel) == ("bcp:a:b", "bcp:main:researcher")
    totals = [(s.charged, s.refunded, s.delivered, s.budget_left) for s in main.steps]
    assert totals == [
        (10.0, 0.0, 0.0, 90.0),
        (10.0, 0.0, 6.5, 90.0),
        (10.0, 2.5, 6.5, 92.5),
        (10.0, 2.5, 6.5, 100.0),
    ]


def steps(*values: tuple[int, float, float | None]) -> History:
    history = History("bcp:main:researcher")
    for second, charged, budget in values:
        ts = f"2026-11-26T10:00:{second:02d}.000000+00:00"
        history.steps.append(Step(ts, charged, 0.0, charged / 2, budget, None))
    return history


def test_draw_steps_from_left_to_right_within_the_frame():
    """Each series is a step line inside the chart, the budget a line at its height."""
    chart = draw(steps((0, 10, 40), (10, 20, 40), (20, 40, 40)), width=100, height=50)
    assert [line.name for line in chart.lines] == ["charged", "refunded", "delivered"]
    charged = [tuple(map(float, p.split(","))) for p in chart.lines[0].points.split()]
    xs = [x for x, _ in charged]
    assert xs == sorted(xs) and xs[0] == 8.0 and xs[-1] == 92.0
    assert all(8.0 <= y <= 42.0 for _, y in charged)
    assert charged[-1][1] == 8.0  # 40 of a 40-bit top: the top of the plot
    assert chart.budget_y == 8.0 and chart.top == 40


def test_draw_keeps_a_busy_channel_small_and_leaves_a_far_budget_out():
    """Thousands of steps become at most ``most``; a budget far above the bits is not drawn."""
    history = steps(*[(s % 60, s, 1e9) for s in range(60)])
    chart = draw(history, most=10)
    assert len(chart.lines[0].points.split()) <= 2 * 10 + 1
    assert chart.budget_y is None
