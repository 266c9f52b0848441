"""GET /metrics: Prometheus text with what the daemon did."""

from __future__ import annotations

from pathlib import Path

from aiohttp import ClientSession

from echo_bot.events import DecisionVerb, approval_action
from tests.conftest import running_bot

CONFIG = """
[webhook]
enabled = true
[http]
port = 0
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""


def value(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {prefix!r} in:\n{text}")


async def test_metrics_count_turns_tools_approvals_and_queues(state_dir: Path) -> None:
    async with running_bot(state_dir, CONFIG, channels=["webhook"]) as bot:
        assert bot.daemon.http is not None
        url = f"http://127.0.0.1:{bot.daemon.http.port}/metrics"
        async with ClientSession() as session:
            async with session.get(url) as response:
                before = await response.text()
            first = await bot.channel.say("what time is it?")
            await bot.channel.reply_to(first)
            asked = await bot.channel.say("/run true")
            prompt = await bot.channel.prompt_for(asked)
            async with session.get(url) as response:
                waiting = await response.text()
            assert prompt.approval is not None
            await bot.channel.press(
                approval_action(DecisionVerb.APPROVE_ONCE, prompt.approval.request_id)
            )
            await bot.channel.reply_to(asked)
            async with session.get(url) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain")
                after = await response.text()
    assert value(waiting, 'echo_bot_queue_depth{queue="approvals_pending"}') == 1
    assert value(after, 'echo_bot_queue_depth{queue="approvals_pending"}') == 0
    inbound = 'echo_bot_inbound_total{channel="cli",kind="message"}'
    grew = value(after, inbound) - (value(before, inbound) if inbound in before else 0)
    assert grew == 2
    assert value(after, 'echo_bot_tool_calls_total{result="ok",tool="current_time"}') >= 1
    assert value(after, 'echo_bot_approvals_total{outcome="approved"}') >= 1
    assert value(after, "echo_bot_turn_seconds_count") >= 2
    assert value(after, 'echo_bot_outbound_total{channel="cli",status="sent"}') >= 3
