"""Text that leaves a management command or a failed start passes the masker."""

from __future__ import annotations

import time
from pathlib import Path

from echo_bot.secrets import MASK, Masker
from echo_bot.statuses import ReminderStatus
from echo_bot.store import DB_FILENAME, Database, Store
from echo_bot.store.reminders import ReminderRow
from tests.conftest import echo_bot_env, run_echo_bot, running_bot

TOKEN = "123456:AAE-masked-output-token-9d1"


def test_attack_token_pasted_into_token_env_is_never_echoed(tmp_path: Path) -> None:
    # A common slip: the token itself where the config wants the variable's name.
    config = tmp_path / "config.toml"
    config.write_text(f'[telegram]\nenabled = true\ntoken_env = "{TOKEN}"\n')
    state = str(tmp_path / "st")
    for args in (("check-config",), ("doctor",), ("run",)):
        result = run_echo_bot(*args, "--config", str(config), "--state-dir", state)
        assert result.returncode != 0, args
        assert "telegram.token_env: not an environment variable name" in (
            result.stdout + result.stderr
        ), args
        assert TOKEN not in result.stdout + result.stderr, args


def test_attack_status_prints_a_secret_from_the_store_masked(tmp_path: Path) -> None:
    state = tmp_path / "st"
    store = Store(Database(state / DB_FILENAME), Masker())
    store.open_sync()
    now = time.time()
    row = ReminderRow(
        id="r1", chat="telegram:42", owner="42", text=f"rotate {TOKEN} today",
        timezone="UTC", recurrence=None, next_at=now + 3600, status=ReminderStatus.ACTIVE,
        created_at=now, fired_count=0, last_fired_at=None, trace_id=None,
    )  # fmt: skip
    try:
        store.run_sync(lambda tx: tx.reminders.insert(row))
    finally:
        store.close_sync()
    env = echo_bot_env(TELEGRAM_BOT_TOKEN=TOKEN)
    result = run_echo_bot("status", "--state-dir", str(state), env=env)
    assert result.returncode == 0, result.stderr
    assert "rotate *** today" in result.stdout
    assert TOKEN not in result.stdout + result.stderr
    listed = run_echo_bot("reminders", "list", "--state-dir", str(state), env=env)
    assert listed.returncode == 0 and TOKEN not in listed.stdout + listed.stderr


async def test_attack_a_secret_sent_by_a_tool_reaches_the_chat_masked(tmp_path: Path) -> None:
    """``send_message`` puts its text in the outbox as given; the delivery worker, the
    one way out to every chat, masks it like a reply."""
    async with running_bot(tmp_path / "state", environ={"TELEGRAM_BOT_TOKEN": TOKEN}) as bot:
        inbound = await bot.channel.say(f'/tool send_message {{"text": "the key is {TOKEN}"}}')
        await bot.channel.reply_to(inbound)
        texts = [m.text for m in bot.channel.sent]
        assert any(f"the key is {MASK}" in text for text in texts), texts
        assert not any(TOKEN in text for text in texts), texts
