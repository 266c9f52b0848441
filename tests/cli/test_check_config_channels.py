"""`check-config` says what `run` will do with the channels: the HTTP server Slack's
HTTP mode opens, the channels it starts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from echo_bot.cli.admin import check_config
from echo_bot.config import LoadedConfig, parse_config


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
