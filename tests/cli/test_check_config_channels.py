"""`check-config` says what `run` will do with the channels: the HTTP server Slack's
HTTP mode opens, the channels it starts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from echo_bot.cli.admin import check_config
from echo_bot.config import LoadedConfig, parse_config
from echo_bot.errors import ConfigError


def checked(tmp_path: Path, text: str, environ: dict[str, str]) -> None:
    """``check-config`` on ``text``: valid (what it printed is the test's to read)."""
    loaded = LoadedConfig(config=parse_config(tomllib.loads(text), "t.toml"), path=tmp_path / "t")
    assert check_config(loaded, tmp_path / "state", environ) == 0


def test_slack_in_http_mode_opens_the_http_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = '[slack]\nenabled = true\nmode = "http"\n'
    checked(tmp_path, text, {"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s"})
    out = capsys.readouterr().out
    assert "the Events API over HTTP at /slack/events on [http]" in out
    (http,) = [line for line in out.splitlines() if line.startswith("http server: ")]
    assert http == "http server: 127.0.0.1:8080 (Slack's Events API)", out


MATRIX = '[matrix]\nenabled = true\nuser_id = "@bot:example.org"\n'


def refused(tmp_path: Path, text: str, environ: dict[str, str]) -> str:
    """``check-config`` on ``text`` refused: its one message."""
    loaded = LoadedConfig(config=parse_config(tomllib.loads(text), "t.toml"), path=tmp_path / "t")
    with pytest.raises(ConfigError) as refusal:
        check_config(loaded, tmp_path / "state", environ)
    return str(refusal.value)


def test_matrix_with_neither_a_token_nor_a_password_is_refused_as_run_refuses_it(
    tmp_path: Path,
) -> None:
    why = refused(tmp_path, MATRIX, {})
    assert "matrix.access_token_env" in why and "MATRIX_ACCESS_TOKEN is not set" in why
    with_password = MATRIX + 'password_env = "MX_PASSWORD"\n'
    why = refused(tmp_path, with_password, {})
    assert "nor MX_PASSWORD for a first login" in why


def test_a_kept_matrix_login_needs_no_token_or_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "state" / "matrix").mkdir(parents=True)
    (tmp_path / "state" / "matrix" / "login.json").write_text('{"access_token": "t"}')
    checked(tmp_path, MATRIX + 'password_env = "MX_PASSWORD"\n', {})
    assert "matrix: on as @bot:example.org" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("bot", "app", "said"),
    [
        ("abc", "xapp-1", "$SLACK_BOT_TOKEN should be the bot token, the app's Bot User"
                          " OAuth Token (xoxb-…); it does not look like a Slack token"),
        ("xapp-1", "xoxb-1", "$SLACK_BOT_TOKEN should be the bot token, the app's Bot User"
                             " OAuth Token (xoxb-…); it holds an app-level token"),
        ("xoxb-1", "xoxb-2", "$SLACK_APP_TOKEN should be the app-level token, with"
                             " connections:write (xapp-…); it holds a bot token"),
    ],
)  # fmt: skip
def test_a_slack_token_of_the_wrong_kind_is_refused_before_any_network_call(
    tmp_path: Path, bot: str, app: str, said: str
) -> None:
    why = refused(tmp_path, "[slack]\nenabled = true\n", {"SLACK_BOT_TOKEN": bot,
                                                           "SLACK_APP_TOKEN": app})  # fmt: skip
    assert said in why, why
    assert bot not in why.replace("$SLACK_BOT_TOKEN", "")  # the value is never shown


def parse(text: str) -> LoadedConfig:
    return LoadedConfig(config=parse_config(tomllib.loads(text), "t.toml"), path=None)


@pytest.mark.parametrize("url", ["http://bot.example.com/console/", "https://example.com/bot"])
def test_a_console_address_with_a_path_is_refused(url: str) -> None:
    with pytest.raises(ConfigError) as refusal:
        parse(f'[console]\nenabled = true\npublic_url = "{url}"\n')
    assert "without a path" in str(refusal.value), refusal.value


def test_a_plain_http_console_address_abroad_needs_saying_so() -> None:
    text = '[console]\nenabled = true\npublic_url = "http://bot.example.com"\n'
    with pytest.raises(ConfigError) as refusal:
        parse(text)
    assert "plain HTTP" in str(refusal.value) and "allow_plain_http" in str(refusal.value)
    assert parse(text + "allow_plain_http = true\n").config.console.allow_plain_http
    parse('[console]\nenabled = true\npublic_url = "http://127.0.0.1:8080"\n')  # this machine


def test_check_config_warns_of_a_console_open_to_the_network_and_of_nobody_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = '[http]\nhost = "0.0.0.0"\n[console]\nenabled = true\n' + MATRIX
    checked(tmp_path, text, {"MATRIX_ACCESS_TOKEN": "syt_x"})
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning:" in line]
    assert len(warnings) == 2, warnings
    assert "plain HTTP on 0.0.0.0:8080" in warnings[0] and "TLS reverse proxy" in warnings[0]
    assert "[matrix] allowed_users is empty" in warnings[1] and "invite" in warnings[1]
    text = text.replace('"0.0.0.0"', '"127.0.0.1"') + 'allowed_users = ["@me:example.org"]\n'
    checked(tmp_path, text, {"MATRIX_ACCESS_TOKEN": "syt_x"})
    assert "warning:" not in capsys.readouterr().out
