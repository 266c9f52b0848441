"""Config: every problem names the file, the dotted key and the reason (exit code 2)."""

from __future__ import annotations

import tomllib
from datetime import timedelta
from pathlib import Path

import pytest

from echo_bot.config import (
    Config,
    LoadedConfig,
    check_environment,
    load_config,
    parse_config,
)
from echo_bot.durations import format_duration, parse_duration
from echo_bot.errors import ConfigError
from echo_bot.statedir import resolve_state_dir
from tests.conftest import echo_bot_env, run_echo_bot

SOURCE = "conf.toml"


def config_error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(tomllib.loads(text), SOURCE)
    assert info.value.exit_code == 2
    return str(info.value)


def single_line(message: str) -> str:
    lines = message.splitlines()
    assert len(lines) == 1, message
    return lines[0]


# --------------------------------------------------------------------------- parse_config

ROUTE_BASE = 'name = "gh"\nauth = "github"\nsecret_env = "GH_SECRET"\n'


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        pytest.param("bogus = 1", "bogus", "unknown key", id="unknown-top-level"),
        pytest.param(
            "[telegram]\nlease = '5s'",
            "telegram.lease",
            "greater than or equal to 10 seconds",
            id="lease-too-short",
        ),
        pytest.param(
            "[storage]\nengine = 'mysql'",
            "storage.engine",
            "'sqlite' or 'postgres'",
            id="unknown-engine",
        ),
        pytest.param(
            "[bot]\ninstance = 'a b'", "bot.instance", "pattern", id="instance-with-a-space"
        ),
        pytest.param(
            "[tools.shell]\nenabeld = true", "tools.shell.enabeld", "unknown key", id="nested"
        ),
        pytest.param(
            "[bot]\nmax_concurrent_turns = 'many'",
            "bot.max_concurrent_turns",
            "valid integer",
            id="wrong-type-int",
        ),
        pytest.param("bot = 5", "bot", "valid dictionary", id="section-not-a-table"),
        pytest.param(
            "[tools.shell]\nenabled = 'maybe'",
            "tools.shell.enabled",
            "write true or false",
            id="wrong-type-bool",
        ),
        pytest.param("[bot]\nlog_level = 'LOUD'", "bot.log_level", "'DEBUG'", id="literal"),
        pytest.param(
            "[approvals]\ntimeout = '15x'",
            "approvals.timeout",
            "'15x' is not a duration",
            id="duration-unit",
        ),
        pytest.param(
            "[approvals]\ntimeout = '-5m'",
            "approvals.timeout",
            "is not a duration",
            id="duration-negative-text",
        ),
        pytest.param(
            "[approvals]\ntimeout = -5",
            "approvals.timeout",
            "positive",
            id="duration-negative-number",
        ),
        pytest.param(
            "[approvals]\ntimeout = 0", "approvals.timeout", "positive", id="duration-zero"
        ),
        pytest.param(
            "[approvals]\ntimeout = true", "approvals.timeout", "duration", id="duration-bool"
        ),
        pytest.param(
            "[approvals]\ntimeout = inf", "approvals.timeout", "finite", id="duration-inf"
        ),
        pytest.param(
            "[approvals]\ntimeout = nan", "approvals.timeout", "finite", id="duration-nan"
        ),
        pytest.param(
            "[approvals]\ntimeout = '99999999999d'",
            "approvals.timeout",
            "at most",
            id="duration-huge",
        ),
        pytest.param(
            "[approvals]\ndefault_chat = 'telegram123'",
            "approvals.default_chat",
            "channel:chat_id",
            id="address",
        ),
        pytest.param(
            "[bot]\ntimezone = 'Mars/Olympus'", "bot.timezone", "unknown timezone", id="timezone"
        ),
        pytest.param(  # a folder of the time zone database, not a zone
            "[bot]\ntimezone = 'Europe'", "bot.timezone", "unknown timezone", id="timezone-folder"
        ),
        pytest.param(
            "[[cron]]\nname = 'j'\nschedule = '* * * *'\nprompt = 'x'\ndeliver_to = 'cli:local'",
            "cron[0].schedule",
            "5 fields",
            id="cron-4-fields",
        ),
        pytest.param(
            "[[webhook.routes]]\n" + ROUTE_BASE + "prompt = 'x'\ntool = 'current_time'",
            "webhook.routes[0]",
            "exactly one of 'prompt' or 'tool'",
            id="route-prompt-and-tool",
        ),
        pytest.param(
            "[[webhook.routes]]\nname = 'open'\nauth = 'none'\nprompt = 'x'",
            "webhook.routes[0]",
            "allow_unauthenticated = true",
            id="route-auth-none",
        ),
        pytest.param(
            "[[webhook.routes]]\nname = 'gh'\nauth = 'github'\nprompt = 'x'",
            "webhook.routes[0]",
            "needs secret_env",
            id="route-github-without-secret",
        ),
        pytest.param(
            "[[webhook.routes]]\n" + ROUTE_BASE + "prompt = 'x'\n"
            "[[webhook.routes]]\n" + ROUTE_BASE + "prompt = 'y'",
            "webhook.routes",
            "duplicate name(s): gh",
            id="duplicate-routes",
        ),
        pytest.param(
            "[[cron]]\nname = 'j'\nschedule = '* * * * *'\nprompt = 'x'\ndeliver_to = 'cli:a'\n"
            "[[cron]]\nname = 'j'\nschedule = '0 9 * * *'\nprompt = 'y'\ndeliver_to = 'cli:a'",
            "cron",
            "duplicate name(s): j",
            id="duplicate-cron",
        ),
        pytest.param(
            "[telegram]\nmode = 'webhook'",
            "telegram",
            "webhook_url",
            id="telegram-webhook-without-url",
        ),
        pytest.param(
            "[telegram]\nmode = 'webhook'\nwebhook_url = 'http://bot.example.org/telegram'",
            "telegram.webhook_url",
            "Telegram sends updates only to an https:// URL with a host (this one has http://)",
            id="telegram-webhook-url-http",
        ),
        pytest.param(
            "[telegram]\nwebhook_url = 'bot.example.org/telegram'",
            "telegram.webhook_url",
            "only to an https:// URL with a host (this one has no scheme)",
            id="telegram-webhook-url-no-scheme",
        ),
        pytest.param(
            "[telegram]\nwebhook_url = 'https:///telegram'",
            "telegram.webhook_url",
            "(this one has no host)",
            id="telegram-webhook-url-no-host",
        ),
        pytest.param(  # Telegram would post to "/", where nothing is served
            "[telegram]\nmode = 'webhook'\nwebhook_url = 'https://bot.example.org'",
            "telegram",
            "needs a path, the one the daemon serves Telegram's posts at",
            id="telegram-webhook-url-no-path",
        ),
    ],
)
def test_parse_config_names_file_key_and_reason(text: str, key: str, reason: str) -> None:
    line = single_line(config_error(text))
    assert line.startswith(f"{SOURCE}: "), line
    assert f"{key}:" in line, line
    assert reason in line, line
    assert "Traceback" not in line


def test_unknown_key_is_named_with_its_full_dotted_path() -> None:
    line = single_line(config_error("[tools.shell]\nenabeld = true"))
    assert line == f"{SOURCE}: tools.shell.enabeld: unknown key"


def test_list_item_errors_name_the_index() -> None:
    line = single_line(config_error("[telegram]\nallowed_users = [1, 'abc']"))
    assert line.startswith(f"{SOURCE}: telegram.allowed_users[1]: ")


def test_several_problems_give_one_line_each() -> None:
    message = config_error(
        "bogus = 1\n[bot]\nnope = 2\ntimezone = 'Nowhere/Else'\n[approvals]\ntimeout = '15x'"
    )
    lines = message.splitlines()
    assert len(lines) == 4, message
    assert all(line.startswith(f"{SOURCE}: ") for line in lines)
    keys = sorted(line.split(": ")[1] for line in lines)
    assert keys == ["approvals.timeout", "bogus", "bot.nope", "bot.timezone"]


def test_valid_config_parses_durations_and_addresses() -> None:
    config = parse_config(
        tomllib.loads(
            "[approvals]\ntimeout = '2h'\ndefault_chat = 'telegram:123'\n"
            "[bot]\ntimezone = 'Europe/Berlin'\nshutdown_timeout = 90\n"
            "[[cron]]\nname = 'daily'\nschedule = '0 9 * * 1-5'\nprompt = 'hi'\n"
            "deliver_to = 'telegram:123:7'\n"
            "[webhook]\nenabled = true\n[[webhook.routes]]\n" + ROUTE_BASE + "tool = 'x'\n"
        ),
        SOURCE,
    )
    assert config.approvals.timeout == timedelta(hours=2)
    assert config.bot.shutdown_timeout == timedelta(seconds=90)
    assert config.cron[0].deliver_to == "telegram:123:7"
    assert config.webhook.routes[0].secret_env == "GH_SECRET"


def test_empty_config_is_all_defaults() -> None:
    assert parse_config({}, SOURCE) == Config()


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("daily_bytes_per_sender = 'lots'", "'lots' is not a size (use e.g. '512KB', '20MB',"),
        ("inbox_max = '5PB'", "'5PB' is not a size"),
        (
            "inbox_max = '1TB'",
            "'1TB' is not a size (use e.g. '512KB', '20MB', '1GB'; the"
            " units are B, KB, MB, GB and KiB, MiB, GiB, up to 1000GB)",
        ),
        ("inbox_max = 0", "a size must be positive"),
        ("daily_bytes_per_sender = '2000GB'", "a size must be at most 1000GB"),
        ("daily_bytes_per_sender = true", "a size must be a number of bytes or a string"),
    ],
)
def test_media_budgets_that_are_no_sizes_are_named(text: str, reason: str) -> None:
    key = text.split(" ", 1)[0]
    line = single_line(config_error("[media]\n" + text))
    assert line.startswith(f"{SOURCE}: media.{key}: {reason}"), line


def test_media_budgets_take_sizes_and_have_defaults() -> None:
    media = parse_config(
        tomllib.loads("[media]\ndaily_bytes_per_sender = '5MB'\ninbox_max = '2GiB'"), SOURCE
    ).media
    assert (media.daily_bytes_per_sender, media.inbox_max) == (5 * 1000**2, 2 * 1024**3)
    default = Config().media
    assert (default.daily_bytes_per_sender, default.inbox_max) == (50 * 1000**2, 1000**3)


def test_check_config_refuses_a_bad_media_budget_with_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[media]\ninbox_max = "a lot"\n')
    result = run_echo_bot("check-config", "--config", str(path), env=echo_bot_env())
    assert result.returncode == 2, result.stderr
    assert f"{path}: media.inbox_max: 'a lot' is not a size" in result.stderr
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------- load_config


def test_load_config_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[bot\ntimezone = 'UTC'\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    line = single_line(str(info.value))
    assert line.startswith(f"{path}: invalid TOML: ")
    assert "line 1" in line


def test_load_config_non_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes("[bot]\ntimezone = 'Zürich'\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert single_line(str(info.value)) == f"{path}: not UTF-8 text"


def test_load_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert single_line(str(info.value)) == f"{path}: no such config file"


def test_load_config_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert single_line(str(info.value)).startswith(f"{tmp_path}: cannot read")


def test_load_config_validation_error_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[tools.shell]\nenabeld = true\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: tools.shell.enabeld: unknown key"


def test_load_config_none_is_embedded_defaults() -> None:
    loaded = load_config(None)
    assert not loaded.from_file and loaded.config == Config()


# --------------------------------------------------------------------------- durations


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("7d", 604800), ("45", 45), (" 3 m ", 180)],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


def test_parse_duration_bare_numbers() -> None:
    assert parse_duration(30) == timedelta(seconds=30)
    assert parse_duration(1.5) == timedelta(seconds=1.5)
    assert parse_duration(timedelta(minutes=1)) == timedelta(minutes=1)


@pytest.mark.parametrize("text", ["90s", "15m", "2h", "7d"])
def test_format_duration_round_trips(text: str) -> None:
    assert format_duration(parse_duration(text)) == text


def test_format_duration_picks_the_largest_whole_unit() -> None:
    assert format_duration(parse_duration("120")) == "2m"
    assert format_duration(parse_duration("90m")) == "90m"
    assert format_duration(parse_duration("48h")) == "2d"


def test_format_duration_keeps_fractions() -> None:
    text = format_duration(parse_duration("0.5"))
    assert text == "0.5s"
    assert parse_duration(text) == timedelta(seconds=0.5)


@pytest.mark.parametrize("bad", ["15x", "-5m", "0", "0s", "", "m", "1e3", "5 minutes"])
def test_parse_duration_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_config_dump_round_trips_through_duration_strings() -> None:
    config = parse_config({"approvals": {"timeout": "0.5"}, "bot": {"shutdown_timeout": "2h"}})
    dumped = config.model_dump(mode="json")
    assert dumped["bot"]["shutdown_timeout"] == "2h"
    assert parse_config(dumped) == config


# --------------------------------------------------------------------------- check_environment


def loaded_from(text: str, path: str = "/etc/echo-bot/config.toml") -> LoadedConfig:
    return LoadedConfig(config=parse_config(tomllib.loads(text), path), path=Path(path))


def test_check_environment_telegram_token_missing() -> None:
    loaded = loaded_from("[telegram]\nenabled = true\n")
    with pytest.raises(ConfigError) as info:
        check_environment(loaded, {})
    line = single_line(str(info.value))
    assert line.startswith("/etc/echo-bot/config.toml: telegram.token_env: ")
    assert "TELEGRAM_BOT_TOKEN" in line and "not set" in line


def test_check_environment_custom_token_variable_is_named() -> None:
    loaded = loaded_from("[telegram]\nenabled = true\ntoken_env = 'MY_TG'\n")
    with pytest.raises(ConfigError, match=r"telegram\.token_env: environment variable MY_TG"):
        check_environment(loaded, {"TELEGRAM_BOT_TOKEN": "not-this-one"})
    check_environment(loaded, {"MY_TG": "123456:x"})  # set, and shaped as a token: fine


def test_check_environment_telegram_off_needs_nothing() -> None:
    check_environment(loaded_from("[telegram]\nenabled = false\n"), {})


def test_check_environment_webhook_route_secret_missing() -> None:
    loaded = loaded_from(
        "[webhook]\nenabled = true\n[[webhook.routes]]\n" + ROUTE_BASE + "tool='x'"
    )
    with pytest.raises(ConfigError) as info:
        check_environment(loaded, {})
    line = single_line(str(info.value))
    assert line.startswith("/etc/echo-bot/config.toml: webhook.routes[0].secret_env: ")
    assert "GH_SECRET" in line
    check_environment(loaded, {"GH_SECRET": "s3cr3t"})


def test_check_environment_lists_every_missing_secret() -> None:
    loaded = loaded_from(
        "[telegram]\nenabled = true\n[webhook]\nenabled = true\n"
        "[[webhook.routes]]\n" + ROUTE_BASE + "tool='x'\n"
    )
    with pytest.raises(ConfigError) as info:
        check_environment(loaded, {})
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert "telegram.token_env" in lines[0]
    assert "webhook.routes[0].secret_env" in lines[1]


# --------------------------------------------------------------------------- the command


def write(tmp_path: Path, text: str, name: str = "config.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def check_config(path: Path, state: Path, **env: str):  # type: ignore[no-untyped-def]
    return run_echo_bot(
        "check-config", "--config", str(path), "--state-dir", str(state), env=echo_bot_env(**env)
    )


def assert_one_line_error(stderr: str, path: Path, key: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith("echo-bot: "), line
    assert str(path) in line, line
    assert key in line, line
    assert "Traceback" not in stderr
    return line


@pytest.mark.parametrize(
    ("text", "key"),
    [
        pytest.param("[bot\ntimezone = 'UTC'\n", "invalid TOML", id="malformed-toml"),
        pytest.param("[tools.shell]\nenabeld = true\n", "tools.shell.enabeld", id="unknown-key"),
        pytest.param("[http]\nport = 'eighty'\n", "http.port", id="wrong-type"),
        pytest.param("[telegram]\nenabled = true\n", "telegram.token_env", id="missing-secret"),
        pytest.param(
            "[approvals]\nnever = ['shell_exec']\n", "approvals.never", id="never-dangerous"
        ),
        pytest.param(
            "[approvals]\nrequire = ['no_such_tool']\n",
            "approvals.require",
            id="require-unknown-tool",
        ),
        pytest.param(
            "[approvals]\nnever = ['no_such_tool']\n", "approvals.never", id="never-unknown-tool"
        ),
        pytest.param("[tools]\nallow = ['no_such_tool']\n", "tools.allow", id="allow-unknown-tool"),
        pytest.param("[tools]\ndeny = ['no_such_tool']\n", "tools.deny", id="deny-unknown-tool"),
        pytest.param("[approvals]\ntimeout = inf\n", "approvals.timeout", id="infinite-duration"),
        pytest.param(
            "[telegram]\nmode = 'webhook'\nwebhook_url = 'http://bot.example.org/tg'\n",
            "telegram.webhook_url",
            id="telegram-webhook-url-http",
        ),
    ],
)
def test_check_config_rejects_with_one_line(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    state = tmp_path / "st"
    result = check_config(path, state)
    assert result.returncode == 2, result
    line = assert_one_line_error(result.stderr, path, key)
    if "unknown tool" in line:
        assert "no_such_tool" in line
    if key == "approvals.never" and "shell_exec" in text:
        assert "dangerous" in line
    assert result.stdout == ""
    assert not state.exists()


def test_check_config_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    result = check_config(path, tmp_path / "st")
    assert result.returncode == 2
    assert_one_line_error(result.stderr, path, "no such config file")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("[bot\n", id="malformed-toml"),
        pytest.param("[tools.shell]\nenabeld = true\n", id="unknown-key"),
        pytest.param("[telegram]\nenabled = true\n", id="missing-secret"),
        pytest.param("[approvals]\nnever = ['shell_exec']\n", id="never-dangerous"),
    ],
)
def test_run_with_bad_config_does_not_touch_the_state_dir(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    state = tmp_path / "st"
    result = run_echo_bot("run", "--config", str(path), "--state-dir", str(state))
    assert result.returncode == 2, result
    assert_one_line_error(result.stderr, path, "")
    assert not state.exists()


def test_check_config_valid_summary_never_shows_secret_values(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[telegram]\nenabled = false\n"
        "[webhook]\nenabled = true\n[[webhook.routes]]\n" + ROUTE_BASE + "prompt = 'hi'\n",
    )
    result = check_config(
        path,
        tmp_path / "st",
        TELEGRAM_BOT_TOKEN="supersecretvalue123",
        GH_SECRET="routesecretvalue456",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert "supersecretvalue123" not in out
    assert "routesecretvalue456" not in out
    assert f"config: {path} — valid" in result.stdout
    # Telegram and the LLM are off: their variables are not listed (nor "not set").
    assert "TELEGRAM_BOT_TOKEN" not in result.stdout
    assert "GH_SECRET set" in result.stdout
    assert "OPENAI_API_KEY" not in result.stdout
    assert "telegram: off" in result.stdout
    assert "webhook: on (1 route(s))" in result.stdout


def test_check_config_summary_shows_durations_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, "[approvals]\ntimeout = '2h'\n")
    result = check_config(path, tmp_path / "st")
    assert result.returncode == 0, result.stderr
    assert "approvals: timeout 2h" in result.stdout


@pytest.mark.parametrize("token", ["garbage", "123456:two words", "bot:123456"])
@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_run_check_config_and_doctor_refuse_a_malformed_bot_token_alike(
    tmp_path: Path, token: str
) -> None:
    path = write(tmp_path, "[telegram]\nenabled = true\n")
    state = tmp_path / "st"
    env = echo_bot_env(TELEGRAM_BOT_TOKEN=token)
    checked = check_config(path, state, TELEGRAM_BOT_TOKEN=token)
    ran = run_echo_bot("run", "--config", str(path), "--state-dir", str(state), env=env)
    for result in (checked, ran):
        assert result.returncode == 2, result
        line = assert_one_line_error(result.stderr, path, "telegram.token_env")
        assert "$TELEGRAM_BOT_TOKEN does not look like a bot token" in line
        assert token not in line
    assert checked.stderr == ran.stderr
    doctor = run_echo_bot("doctor", "--config", str(path), "--state-dir", str(state), env=env)
    assert doctor.returncode == 1, doctor
    (config_line,) = [line for line in doctor.stdout.splitlines() if "] config" in line]
    assert config_line.startswith("[FAIL]")
    assert checked.stderr.strip().removeprefix("echo-bot: ") in config_line
    # Nothing was sent to the Bot API with it: the telegram check says why it did not ask.
    (telegram,) = [line for line in doctor.stdout.splitlines() if "] telegram" in line]
    assert "not asked: $TELEGRAM_BOT_TOKEN does not look like a bot token" in telegram
    assert token not in doctor.stdout


def test_check_config_says_where_the_store_is_and_how_off_tools_switch_on(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    plain = check_config(write(tmp_path, ""), state)
    assert plain.returncode == 0, plain.stderr
    out = plain.stdout.splitlines()
    assert f"storage: SQLite {state / 'echo-bot.sqlite3'} (retention 30d)" in out
    assert "shell_exec: off ([tools.shell] enabled = true switches it on)" in out
    assert "http_request: off ([tools.http] allow_domains switches it on)" in out

    hidden = check_config(
        write(tmp_path, "[tools.http]\nallow_domains = ['example.org']\n", "http.toml"), state
    )
    assert "http_request: on, but not offered: the tools profile leaves it out ([tools] allow)" in (
        hidden.stdout.splitlines()
    )
    offered = check_config(
        write(
            tmp_path,
            "[storage]\nengine = 'postgres'\nretention = '14d'\n"
            "[tools]\nallow = ['http_request']\n[tools.http]\nallow_domains = ['example.org']\n",
            "pg.toml",
        ),
        state,
        ECHO_BOT_DATABASE_URL="postgresql://bot:s3cret-pw@db.example:5432/echo",
    )
    assert offered.returncode == 0, offered.stderr
    lines = offered.stdout.splitlines()
    assert "storage: PostgreSQL db.example:5432/echo (retention 14d)" in lines
    assert "http_request: on" in lines
    assert "s3cret-pw" not in offered.stdout


@pytest.mark.parametrize("value", ['"yes"', '"true"', "1", '"on"'])
def test_a_boolean_key_takes_only_a_boolean(value: str) -> None:
    """`enabled = "yes"` was read as true: a typo or a quoted word never switches a part
    on (or off) by pydantic's guess."""
    with pytest.raises(ConfigError) as refusal:
        parse_config(tomllib.loads(f"[console]\nenabled = {value}\n"), "t.toml")
    assert "console.enabled: write true or false, without quotes" in str(refusal.value)


def test_a_relative_state_dir_is_read_beside_the_config_file(tmp_path: Path) -> None:
    """The service runs in its WorkingDirectory, the owner's commands anywhere: both
    find the same store."""
    folder = tmp_path / "etc"
    folder.mkdir()
    (folder / "echo-bot.toml").write_text('[bot]\nstate_dir = "state"\n')
    loaded = load_config(folder / "echo-bot.toml")
    assert loaded.config.bot.state_dir == folder / "state"
    assert resolve_state_dir(None, loaded.config.bot.state_dir, {}) == (folder / "state").resolve()
