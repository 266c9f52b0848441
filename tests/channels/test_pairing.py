"""Pairing lets a person chat, never approve; the owner lists and revokes pairings.

The approval attacks go through the real Telegram channel (real aiogram against the
fake Bot API); the management commands run as real ``echo-bot`` processes, beside a
running daemon where that is the point.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.channels.test_telegram import (
    OWNER,
    RUN_ONCE,
    STRANGER,
    action,
    answer_of,
    approval_status,
    barrier,
    chat_of,
    edited,
    edits,
    keyboard,
    press,
    prompt_in,
    ran,
    reply_to,
    say,
    sends,
    sent_id,
    telegram_bot,
    text_of,
)
from tests.conftest import Bot, echo_bot_env, run_echo_bot
from tests.fakes.telegram_api import FakeTelegramAPI

GROUP = -(10**12 + OWNER)  # the fake's supergroup id for a group the owner writes in


async def pair(bot: Bot, api: FakeTelegramAPI, user_id: int, **kwargs: object) -> None:
    code = await bot.store.run(lambda tx: tx.access.new_pairing_code())
    paired = say(api, f"/pair {code}", user_id=user_id, **kwargs)
    assert "Paired" in text_of(await reply_to(api, paired, chat_id=user_id))


async def test_attack_paired_user_presses_approve_on_a_prompt_and_is_refused(
    state_dir: Path,
) -> None:
    """Regression: with ``approvers`` unset, a paired user could approve (shell included)."""
    async with telegram_bot(state_dir) as (bot, api):
        await pair(bot, api, STRANGER)
        # The owner asks in a group both are in; the prompt shows there with its buttons.
        run = say(api, RUN_ONCE, user_id=OWNER, chat_type="supergroup")
        prompt = await prompt_in(api, GROUP)
        data = action(prompt, "approve_once")

        answer = await answer_of(
            api, press(api, data, sent_id(prompt), user_id=STRANGER, chat_id=GROUP)
        )
        assert "not allowed" in answer
        assert await approval_status(bot, data) == "pending"
        assert edits(api, sent_id(prompt), chat_id=GROUP) == []
        assert ran(bot) is None

        await answer_of(api, press(api, data, sent_id(prompt), user_id=OWNER, chat_id=GROUP))
        await reply_to(api, run, "exit code 0", chat_id=GROUP)
        await edited(api, sent_id(prompt), "✅ Approved", chat_id=GROUP)
        assert ran(bot) == "x\n"


async def test_a_paired_users_risky_request_goes_to_the_default_chat(state_dir: Path) -> None:
    """Routed like any non-approver's: not to their own chat (where they would press
    Approve themselves) but to ``[approvals] default_chat``."""
    extra = f'[approvals]\ndefault_chat = "telegram:{GROUP}"\n'
    async with telegram_bot(state_dir, extra) as (bot, api):
        await pair(bot, api, STRANGER)
        run = say(api, RUN_ONCE, user_id=STRANGER)
        await api.wait_for_call(
            "sendMessage", lambda c: chat_of(c) == STRANGER and "needs approval" in text_of(c)
        )
        prompt = await prompt_in(api, GROUP)
        assert not [c for c in sends(api, STRANGER) if keyboard(c)]
        data = action(prompt, "approve_once")

        # Pressing it in their own chat, or in the group, changes nothing.
        for chat_id in (STRANGER, GROUP):
            answer = await answer_of(
                api, press(api, data, sent_id(prompt), user_id=STRANGER, chat_id=chat_id)
            )
            assert "not allowed" in answer, (chat_id, answer)
        assert await approval_status(bot, data) == "pending"
        assert ran(bot) is None

        await answer_of(api, press(api, data, sent_id(prompt), user_id=OWNER, chat_id=GROUP))
        await edited(api, sent_id(prompt), "✅ Approved", chat_id=GROUP)
        await reply_to(api, run, "exit code 0", chat_id=STRANGER)
        assert ran(bot) == "x\n"


# -- management commands as real processes ---------------------------------------------
async def test_pairings_list_and_revoke_refuse_a_revoked_user_at_once(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (bot, api):
        await pair(bot, api, STRANGER, username="night_owl")
        await barrier(api, STRANGER, username="night_owl")

        listed = await asyncio.to_thread(
            run_echo_bot, "pairings", "list", "--state-dir", str(state_dir)
        )
        assert listed.returncode == 0, listed.stderr
        (line,) = listed.stdout.splitlines()
        assert line.startswith(f"telegram:{STRANGER}  night_owl  paired 20"), line

        revoked = await asyncio.to_thread(
            run_echo_bot, "pairings", "revoke", str(STRANGER), "--state-dir", str(state_dir)
        )
        assert revoked.returncode == 0, revoked.stderr
        assert f"Revoked {STRANGER}" in revoked.stdout

        # The running daemon refuses their very next message; nothing reaches the agent.
        after = say(api, "what time is it?", user_id=STRANGER)
        refusal = text_of(await reply_to(api, after, chat_id=STRANGER))
        assert "allowed" in refusal and str(STRANGER) in refusal

        empty = await asyncio.to_thread(
            run_echo_bot, "pairings", "list", "--state-dir", str(state_dir)
        )
        assert empty.stdout.strip() == "No paired users."
        again = await asyncio.to_thread(
            run_echo_bot, "pairings", "revoke", str(STRANGER), "--state-dir", str(state_dir)
        )
        assert again.returncode == 1
        assert "not a paired user" in again.stdout


def test_pairings_revoke_of_a_configured_user_points_to_the_config(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[telegram]\nenabled = true\nallowed_users = [42]\n")
    state = tmp_path / "st"
    args = ("--config", str(config), "--state-dir", str(state))
    env = echo_bot_env(TELEGRAM_BOT_TOKEN="123:abc")
    assert run_echo_bot("pair", *args, env=env).returncode == 0  # creates the store
    result = run_echo_bot("pairings", "revoke", "42", *args, env=env)
    assert result.returncode == 1
    assert "allowed_users" in result.stdout


def test_attack_pair_refuses_when_no_channel_that_pairs_is_on(tmp_path: Path) -> None:
    """A code nobody can use is no code: `echo-bot pair` says why in one line, exit 2."""
    state = tmp_path / "st"
    bare = run_echo_bot("pair", "--state-dir", str(state))
    assert bare.returncode == 2
    assert bare.stdout == ""
    assert len(bare.stderr.splitlines()) == 1, bare.stderr
    assert "no channel that pairs strangers" in bare.stderr
    assert "TELEGRAM_BOT_TOKEN" in bare.stderr

    config = tmp_path / "config.toml"
    config.write_text("[telegram]\nallowed_users = [42]\n")
    env = echo_bot_env(TELEGRAM_BOT_TOKEN="123:abc")  # a token alone does not switch it on
    off = run_echo_bot("pair", "--config", str(config), "--state-dir", str(state), env=env)
    assert off.returncode == 2
    assert len(off.stderr.splitlines()) == 1, off.stderr
    assert "enabled = true" in off.stderr and str(config) in off.stderr
    assert not (state / "echo-bot.sqlite3").exists()

    on = run_echo_bot("pair", "--state-dir", str(state), env=env)
    assert on.returncode == 0, on.stderr
    assert "Pairing code:" in on.stdout


@pytest.mark.parametrize(
    ("section", "env", "said"),
    [
        ("[slack]\nenabled = true\n", {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"},
         "on Slack, in a direct message to the bot: pair "),
        ('[matrix]\nenabled = true\nuser_id = "@bot:example.org"\n',
         {"MATRIX_ACCESS_TOKEN": "syt_x"}, "on Matrix: invite the bot to a direct chat, then"),
    ],
    ids=["slack", "matrix"],
)  # fmt: skip
def test_pair_makes_a_code_for_slack_or_matrix_with_telegram_off(
    tmp_path: Path, section: str, env: dict[str, str], said: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(section)
    args = ("--config", str(config), "--state-dir", str(tmp_path / "st"))
    done = run_echo_bot("pair", *args, env=echo_bot_env(**env))
    assert done.returncode == 0, done.stderr
    assert "Pairing code:" in done.stdout and said in done.stdout, done.stdout
    assert "Telegram" not in done.stdout


def test_pair_sees_a_token_given_as_a_systemd_credential(tmp_path: Path) -> None:
    """With no config file, a token that is only a credential switches Telegram on."""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "TELEGRAM_BOT_TOKEN").write_text("123:abc\n")
    env = echo_bot_env(CREDENTIALS_DIRECTORY=str(credentials))
    on = run_echo_bot("pair", "--state-dir", str(tmp_path / "st"), env=env)
    assert on.returncode == 0, on.stderr
    assert "Pairing code:" in on.stdout


async def test_pairings_revoke_takes_a_matrix_id_whose_colons_are_its_own(tmp_path: Path) -> None:
    """``matrix:@night:example.org`` names the user ``@night:example.org`` on Matrix (the
    address's first colon ends the channel); a bare id is looked for on every channel."""
    from echo_bot.secrets import Masker
    from echo_bot.store import DB_FILENAME, Database, Store

    config = tmp_path / "config.toml"
    config.write_text('[matrix]\nenabled = true\nuser_id = "@bot:example.org"\n')
    state = tmp_path / "st"
    args = ("--config", str(config), "--state-dir", str(state))
    env = echo_bot_env(MATRIX_ACCESS_TOKEN="syt_x")
    made = run_echo_bot("pair", *args, env=env)
    assert made.returncode == 0, made.stderr
    code = made.stdout.split("Pairing code: ")[1].split()[0]
    store = Store(Database(state / DB_FILENAME), Masker())
    await store.open()
    try:
        said = await store.run(lambda tx: tx.access.try_pair("matrix", "@night:example.org", code))
        assert said == "paired"
    finally:
        await store.close()

    listed = run_echo_bot("pairings", "list", *args, env=env)
    assert listed.stdout.startswith("matrix:@night:example.org  (name unknown)  paired"), listed
    revoked = run_echo_bot("pairings", "revoke", "matrix:@night:example.org", *args, env=env)
    assert revoked.returncode == 0, revoked.stdout + revoked.stderr
    again = run_echo_bot("pairings", "revoke", "@night:example.org", *args, env=env)
    assert again.returncode == 1 and "is not a paired user" in again.stdout
