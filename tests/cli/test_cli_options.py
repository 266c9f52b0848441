"""The `echo-bot` command line as a user types it: option order, --help, approval ids
by prefix, and one word for the brain everywhere."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from echo_bot.cli.main import _parser
from tests.conftest import echo_bot_env, run_echo_bot
from tests.proc import EchoBotProcess

SHELL_CONFIG = '[tools]\nprofile = "coding"\n[tools.shell]\nenabled = true\n'
COUNT = '/tool shell_exec {"argv": ["sh", "-c", "echo ran >> count.txt"]}'


Command = tuple[str, ...]


def _commands(parser: argparse.ArgumentParser, prefix: Command = ()) -> list[Command]:
    """Every command and nested action the parser knows, e.g. ("webhook", "send")."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found += _commands(sub, (*prefix, name))
    return found


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_global_options_work_before_the_subcommand(tmp_path: Path) -> None:
    state = tmp_path / "st"
    assert run_echo_bot("chat", "--state-dir", str(state), input="/help\n").returncode == 0
    before = run_echo_bot("--state-dir", str(state), "status")
    assert before.returncode == 0, before.stderr
    assert f"state: {state / 'echo-bot.sqlite3'}" in before.stdout
    after = run_echo_bot("status", "--state-dir", str(state))
    assert before.stdout == after.stdout
    config = tmp_path / "c.toml"
    config.write_text(SHELL_CONFIG)
    checked = run_echo_bot("--config", str(config), "--verbose", "check-config")
    assert checked.returncode == 0, checked.stderr
    assert "shell_exec: on" in checked.stdout
    nested = run_echo_bot("webhook", "--state-dir", str(state), "deliveries", "--limit", "5")
    assert nested.returncode == 0, nested.stderr


@pytest.mark.parametrize("command", _commands(_parser()), ids=" ".join)
def test_every_subcommand_help_has_a_description(command: tuple[str, ...]) -> None:
    result = run_echo_bot(*command, "--help")
    assert result.returncode == 0, result.stderr
    # argparse: the usage block, a blank line, then the description (if there is one).
    after_usage = result.stdout.split("\n\n")[1]
    assert not after_usage.startswith(("positional arguments:", "options:")), result.stdout
    assert after_usage.strip() and "\n" not in after_usage.strip(), after_usage


def _brain_words(text: str) -> str:
    match = re.search(r"brain: ([^;\n]+)", text)
    assert match, text
    return match.group(1).strip()


@pytest.mark.parametrize(
    "config_text",
    ["", '[openai]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "llama3.1"\n'],
    ids=["rules", "llm"],
)
@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_banner_check_config_and_status_name_the_brain_alike(
    tmp_path: Path, config_text: str
) -> None:
    config, state = tmp_path / "c.toml", tmp_path / "st"
    config.write_text(config_text)
    checked = run_echo_bot("check-config", "--config", str(config), "--state-dir", str(state))
    assert checked.returncode == 0, checked.stderr
    words = _brain_words(checked.stdout)
    bot = EchoBotProcess("run", "--config", str(config), "--state-dir", str(state),
                         stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        banner = bot.expect_stderr(r"^echo-bot .* brain: ")
        bot.expect_stderr(r"^stop with")
        status = run_echo_bot("status", "--state-dir", str(state))
        assert bot.terminate() == 0
    finally:
        bot.cleanup()
    assert _brain_words(banner) == words
    assert _brain_words(status.stdout) == words
    assert words == ("llm (llama3.1)" if config_text else "rules")


def _pending_request(args: tuple[str, ...]) -> tuple[EchoBotProcess, str]:
    bot = EchoBotProcess(*args)
    bot.expect_stderr(r"^state: ")
    bot.send(COUNT)
    prompt = bot.expect_stdout(r"^Approve shell_exec")
    request = re.search(r"request ([0-9a-f]{32})", prompt)
    assert request, prompt
    return bot, request.group(1)


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_approvals_are_found_by_a_unique_prefix_and_an_ambiguous_one_lists_them(
    tmp_path: Path,
) -> None:
    config, state = tmp_path / "c.toml", tmp_path / "st"
    config.write_text(SHELL_CONFIG)
    args = ("chat", "--config", str(config), "--state-dir", str(state))
    first, first_id = _pending_request(args)  # left pending: the process is killed
    first.kill9()
    first.cleanup()
    second, second_id = _pending_request(args)
    try:
        same = next(i for i, (a, b) in enumerate(zip(first_id, second_id, strict=True)) if a != b)
        common = first_id[:same]
        assert len(common) >= 6  # ids begin with their time: made seconds apart
        ambiguous = run_echo_bot("approvals", "show", common, "--state-dir", str(state))
        assert ambiguous.returncode == 2
        problem = ambiguous.stderr.strip()
        assert "\n" not in problem and "ambiguous" in problem
        assert first_id in problem and second_id in problem

        short = run_echo_bot("approvals", "approve", second_id[:5], "--state-dir", str(state))
        assert short.returncode == 2 and "at least its first 6 characters" in short.stderr

        prefix = second_id[: len(common) + 1]
        shown = run_echo_bot("approvals", "show", prefix, "--state-dir", str(state))
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert f"request:   {second_id}" in shown.stdout
        assert "status:    pending" in shown.stdout

        approved = run_echo_bot("approvals", "approve", prefix, "--state-dir", str(state))
        assert approved.returncode == 0, approved.stdout + approved.stderr
        assert f"Approved: {second_id}" in approved.stdout
        second.expect_stdout(r"exit code 0")
        denied = run_echo_bot(
            "approvals", "deny", first_id[: len(common) + 1].upper(), "--state-dir", str(state)
        )
        assert denied.returncode == 0, denied.stdout + denied.stderr
        assert f"Denied: {first_id}" in denied.stdout
    finally:
        second.cleanup()
    listed = run_echo_bot("approvals", "list", "--state-dir", str(state), env=echo_bot_env())
    assert "No approvals are pending." in listed.stdout


def test_webhook_send_without_a_config_says_how_to_point_at_one(tmp_path: Path) -> None:
    data = tmp_path / "payload.json"
    data.write_text("{}")
    env = echo_bot_env()
    env.pop("ECHO_BOT_CONFIG", None)
    bare = run_echo_bot("webhook", "send", "deploy", "--data", str(data), env=env)
    assert bare.returncode == 2
    assert bare.stderr == (
        "echo-bot: no webhook route 'deploy': no config file was given, and the embedded"
        " defaults have no routes; point at the daemon's config with --config PATH (or"
        " $ECHO_BOT_CONFIG)\n"
    )
    config = tmp_path / "c.toml"
    config.write_text(
        "[webhook]\nenabled = true\n[[webhook.routes]]\nname = 'ci'\nauth = 'bearer'\n"
        "secret_env = 'CI_SECRET'\nprompt = 'hi'\n"
    )
    wrong = run_echo_bot("webhook", "send", "deploy", "--data", str(data),
                         "--config", str(config), env=echo_bot_env(CI_SECRET="x"))  # fmt: skip
    assert wrong.returncode == 2
    assert wrong.stderr == f"echo-bot: no webhook route 'deploy' in {config} (its routes: ci)\n"
