"""`echo-bot doctor` for Slack as the user runs it (a subprocess), against the fake Slack:
the bot token (whose, and its scopes against those the channel uses) and the
transport's secret (Socket Mode's app token; HTTP mode's signing secret)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_doctor_checks import doctor
from tests.fakes.slack_api import FakeSlack


def slack_config(tmp_path: Path, slack: FakeSlack, extra: str = "") -> Path:
    path = tmp_path / "config.toml"
    path.write_text(
        f'[slack]\nenabled = true\napi_base = "{slack.base_url}"\n'
        f'allowed_users = ["U0OWNER"]\n{extra}'
    )
    return path


def line(output: str, name: str) -> str:
    (found,) = [row for row in output.splitlines() if f"] {name} " in row]
    return found


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_doctor_checks_the_tokens_and_the_scopes(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        args = ("--config", str(slack_config(tmp_path, slack)), "--state-dir", str(tmp_path / "s"))
        code, out = await doctor(*args, SLACK_BOT_TOKEN=slack.bot_token,
                                 SLACK_APP_TOKEN=slack.app_token)  # fmt: skip
        assert code == 0, out
        bot = line(out, "slack bot token")
        assert bot.startswith("[  ok]") and "U0BOT" in bot and "chat:write" in bot
        assert line(out, "slack app token").startswith("[  ok]")
        assert slack.bot_token not in out and slack.app_token not in out

        code, out = await doctor(*args, SLACK_BOT_TOKEN="xoxb-revoked",
                                 SLACK_APP_TOKEN=slack.app_token)  # fmt: skip
        assert code == 1 and line(out, "slack bot token").startswith("[FAIL]")
        assert "invalid_auth" in out and "Bot User OAuth Token" in out
        # The app token is checked on its own, whatever became of the bot token.
        assert line(out, "slack app token").startswith("[  ok]"), out

        code, out = await doctor(*args, SLACK_BOT_TOKEN=slack.bot_token,
                                 SLACK_APP_TOKEN=slack.bot_token)  # fmt: skip
        assert code == 1 and line(out, "slack app token").startswith("[FAIL]")
        assert "connections:write" in out and "Socket Mode on" in out


async def test_doctor_names_the_scopes_a_token_lacks(tmp_path: Path) -> None:
    async with FakeSlack(scopes=("chat:write", "im:history")) as slack:
        config = slack_config(tmp_path, slack)
        tokens = {"SLACK_BOT_TOKEN": slack.bot_token, "SLACK_APP_TOKEN": slack.app_token}
        code, out = await doctor("--config", str(config), "--state-dir", str(tmp_path), **tokens)
    assert code == 1, out
    bot = line(out, "slack bot token")
    assert bot.startswith("[FAIL]") and "app_mentions:read" in bot and "files:read" in bot
    assert "reinstall the app" in bot


async def test_doctor_in_http_mode_needs_the_signing_secret(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        config = slack_config(tmp_path, slack, 'mode = "http"\n[http]\nport = 0\n')
        args = ("--config", str(config), "--state-dir", str(tmp_path / "s"))
        code, out = await doctor(*args, SLACK_BOT_TOKEN=slack.bot_token)
        assert code == 1
        assert "SLACK_SIGNING_SECRET" in out
        code, out = await doctor(*args, SLACK_BOT_TOKEN=slack.bot_token,
                                 SLACK_SIGNING_SECRET="s3cret-value")  # fmt: skip
    assert line(out, "slack signing secret").startswith("[  ok]"), out
    assert "s3cret-value" not in out and "slack app token" not in out


@pytest.mark.parametrize("failure", ["unreachable", "503"])
async def test_doctor_says_slack_cannot_be_reached_not_that_a_token_is_wrong(
    failure: str, tmp_path: Path
) -> None:
    async with FakeSlack() as slack:
        tokens = {"SLACK_BOT_TOKEN": slack.bot_token, "SLACK_APP_TOKEN": slack.app_token}
        if failure == "503":
            slack.fail_next("auth.test", status=503, error="service_unavailable")
            config = slack_config(tmp_path, slack)
        else:
            config = tmp_path / "config.toml"
            config.write_text(
                '[slack]\nenabled = true\napi_base = "http://127.0.0.1:9/api/"\n'
                'allowed_users = ["U0OWNER"]\n'
            )
        code, out = await doctor("--config", str(config), "--state-dir", str(tmp_path), **tokens)
    assert code == 1, out
    reach = line(out, "slack api")
    assert reach.startswith("[FAIL]") and "cannot reach" in reach and "keeps trying" in reach
    assert "slack bot token" not in out  # nothing says the token is wrong
    assert line(out, "slack app token").startswith("[warn]") and "is set" in out
    assert "Fix: slack api." in out
