"""`check-config` and `run` refuse configs that cannot work: a route or job naming a
tool that does not exist or is switched off, or delivering to a channel that does not
exist or is off. One line per problem with the key path, exit 2, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_bot import app, config
from tests.conftest import echo_bot_env, run_echo_bot

ENV = {"DEPLOY_SECRET": "whsec_" + "A" * 32, "TELEGRAM_BOT_TOKEN": "123:token-value"}

TELEGRAM = "[telegram]\nenabled = true\nallowed_users = [123456789]\n"
WEBHOOK = "[webhook]\nenabled = true\n"
# The README's deploy route, as it was printed.
DEPLOY = """
[[webhook.routes]]
name = "deploy"
auth = "standard"
secret_env = "DEPLOY_SECRET"
deliver_to = "telegram:123456789"
tool = "shell_exec"
args = { argv = ["./deploy.sh", "{payload[ref]}"] }
"""
CRON = """
[[cron]]
name = "brief"
schedule = "30 7 * * 1-5"
deliver_to = "cli:local"
"""


def check(tmp_path: Path, text: str, command: str = "check-config") -> tuple[int, str, str]:
    path = tmp_path / "echo-bot.toml"
    path.write_text(text)
    state = tmp_path / "st"
    result = run_echo_bot(
        command, "--config", str(path), "--state-dir", str(state), env=echo_bot_env(**ENV)
    )
    if result.returncode != 0:
        assert not state.exists(), "a refused config must not touch the state dir"
    return result.returncode, result.stdout, result.stderr


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("echo-bot: ")]


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_route_whose_tool_is_switched_off_is_a_config_error(tmp_path: Path, command: str) -> None:
    code, out, err = check(tmp_path, TELEGRAM + WEBHOOK + DEPLOY, command)
    assert code == 2, out + err
    [line] = error_lines(err)
    assert line.endswith(
        "echo-bot.toml: webhook.routes[0].tool: shell_exec is switched off "
        "([tools.shell] enabled = true switches it on) (route deploy)"
    ), line
    assert "valid" not in out


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_a_route_or_job_naming_an_unknown_tool_is_a_config_error(
    tmp_path: Path, command: str
) -> None:
    text = WEBHOOK + DEPLOY.replace("shell_exec", "shell_exce") + CRON + 'tool = "clock"\n'
    code, out, err = check(tmp_path, text.replace("telegram:123456789", "cli:local"), command)
    assert code == 2, out + err
    first, second = error_lines(err)
    assert "webhook.routes[0].tool: unknown tool 'shell_exce'" in first
    assert "current_time" in first  # the names that do exist
    assert "cron[0].tool: unknown tool 'clock'" in second and "(job brief)" in second


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_delivering_to_a_channel_that_does_not_exist_is_a_config_error(
    tmp_path: Path, command: str
) -> None:
    text = TELEGRAM + CRON.replace("cli:local", "telegarm:1") + 'prompt = "hi"\n'
    code, out, err = check(tmp_path, text, command)
    assert code == 2, out + err
    [line] = error_lines(err)
    assert "cron[0].deliver_to: no channel 'telegarm' in 'telegarm:1'" in line
    assert "cli, discord, email, matrix, slack, telegram, webhook" in line


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_delivering_to_a_channel_that_is_off_is_a_config_error(
    tmp_path: Path, command: str
) -> None:
    text = (
        "[tools.shell]\nenabled = true\n"
        + WEBHOOK
        + DEPLOY
        + CRON.replace("cli:local", "telegram:123456789")
        + 'prompt = "hi"\n'
    )
    code, out, err = check(tmp_path, text, command)
    assert code == 2, out + err
    first, second = error_lines(err)
    off = "the telegram channel is off ([telegram] enabled = true switches it on)"
    assert f"webhook.routes[0].deliver_to: {off} (route deploy)" in first
    assert f"cron[0].deliver_to: {off} (job brief)" in second


def test_a_jobs_arguments_that_its_tool_refuses_are_a_config_error(tmp_path: Path) -> None:
    text = CRON + 'tool = "current_time"\nargs = { zone = "UTC" }\n'
    code, out, err = check(tmp_path, text)
    assert code == 2, out + err
    [line] = error_lines(err)
    assert "cron[0].args: invalid arguments for current_time" in line and "zone" in line


def test_routes_of_a_disabled_webhook_section_may_need_what_is_off(tmp_path: Path) -> None:
    """Switched off, a route runs nothing; only names that exist nowhere are errors."""
    code, _, err = check(tmp_path, DEPLOY)
    assert code == 0, err
    code, _, err = check(tmp_path, DEPLOY.replace("telegram:", "telegarm:"))
    assert code == 2 and "no channel 'telegarm'" in err


def test_the_fixed_deploy_route_passes(tmp_path: Path) -> None:
    text = TELEGRAM + WEBHOOK + DEPLOY + "[tools.shell]\nenabled = true\n"
    code, out, err = check(tmp_path, text)
    assert code == 0, err
    assert "— valid" in out


def test_check_config_does_not_list_secrets_of_disabled_features(tmp_path: Path) -> None:
    code, out, err = check(tmp_path, DEPLOY.replace("telegram:123456789", "cli:local"))
    assert code == 0, err
    [secrets] = [line for line in out.splitlines() if line.startswith("secrets")]
    # Telegram, the LLM and the webhook section are off: none of their variables is read.
    assert "TELEGRAM_BOT_TOKEN" not in secrets
    assert "OPENAI_API_KEY" not in secrets
    assert "DEPLOY_SECRET" not in secrets
    assert "TELEGRAM_WEBHOOK_SECRET" not in secrets
    code, out, err = check(
        tmp_path, TELEGRAM + WEBHOOK + DEPLOY + "[tools.shell]\nenabled = true\n"
    )
    [secrets] = [line for line in out.splitlines() if line.startswith("secrets")]
    assert "TELEGRAM_BOT_TOKEN set" in secrets and "DEPLOY_SECRET set" in secrets
    assert "OPENAI_API_KEY" not in secrets and "TELEGRAM_WEBHOOK_SECRET" not in secrets


def test_check_config_lists_the_admin_token_whenever_the_http_server_runs(
    tmp_path: Path,
) -> None:
    """/healthz details need the admin token also without webhooks ([http] enabled)."""
    text = '[http]\nenabled = true\n[webhook]\nadmin_token_env = "ECHO_BOT_ADMIN_TOKEN"\n'
    code, out, err = check(tmp_path, text)
    assert code == 0, err
    [secrets] = [line for line in out.splitlines() if line.startswith("secrets")]
    assert "ECHO_BOT_ADMIN_TOKEN" in secrets, secrets


def test_the_channels_an_address_may_name_are_the_installed_channels_and_each_loads() -> None:
    names = config.channel_names()
    assert {"cli", "telegram", "matrix", "slack", "webhook"} <= set(names)
    for name in names:
        assert app.load_channel_class(name).name == name
