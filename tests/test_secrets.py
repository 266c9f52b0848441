"""Secret values are masked wherever they could appear: text, data, logs."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from echo_bot.logs import setup_logging
from echo_bot.secrets import MASK, Masker, is_secret_key

TOKEN = "123456:AAE-telegram-bot-token"
KEY = "sk-live-abcdefghijklmnop"


# --------------------------------------------------------------------------- Masker


def test_masks_every_occurrence() -> None:
    masker = Masker([TOKEN])
    text = f"GET https://api.telegram.org/bot{TOKEN}/getMe then again {TOKEN}."
    assert masker.mask(text) == f"GET https://api.telegram.org/bot{MASK}/getMe then again {MASK}."


def test_longest_value_first() -> None:
    # "abcd" is inside the longer secret; masking it first would leave "efgh1234" visible
    masker = Masker(["abcd", "abcdefgh1234"])
    assert masker.mask("x abcdefgh1234 y abcd") == f"x {MASK} y {MASK}"
    masker = Masker(["abcdefgh1234"])
    masker.add(["abcd"])  # order of adding does not matter
    assert masker.mask("abcdefgh1234") == MASK


def test_find_tells_where_the_secrets_are_as_mask_replaces_them() -> None:
    masker = Masker(["abcd", "abcdefgh1234", "1234xy"])
    text = "abcd abcdefgh1234xy abcdabcd 🙂 abcd"
    found = masker.find(text)
    # Overlapping secrets are one span (mask() leaves "xy" of this one); secrets side by
    # side stay two, as mask() has them.
    assert found == [(0, 4), (5, 19), (20, 24), (24, 28), (31, 35)]
    rebuilt, at = "", 0
    for start, end in found:
        rebuilt += text[at:start] + MASK
        at = end
    assert rebuilt + text[at:] == f"{MASK} {MASK} {MASK}{MASK} 🙂 {MASK}"
    assert masker.find("nothing to see") == [] and Masker().find(text) == []


def test_short_and_empty_values_are_ignored() -> None:
    masker = Masker(["", "a", "ab", "abc"])
    text = "a cab sat on abc"
    assert masker.mask(text) == text


def test_from_environment_takes_only_named_set_variables() -> None:
    env = {"TELEGRAM_BOT_TOKEN": TOKEN, "OPENAI_API_KEY": "", "PATH": "/usr/bin:/bin"}
    masker = Masker.from_environment(["TELEGRAM_BOT_TOKEN", "OPENAI_API_KEY", "UNSET"], env)
    assert masker.mask(f"{TOKEN} /usr/bin") == f"{MASK} /usr/bin"


def test_text_without_secrets_is_unchanged() -> None:
    masker = Masker([TOKEN, KEY])
    assert masker.mask("nothing to see 🙂") == "nothing to see 🙂"


@pytest.mark.parametrize(
    "key", ["token", "bot_token", "api_key", "apiKey", "API-KEY", "Authorization", "password",
            "client_secret", "Cookie", "passwd"],
)  # fmt: skip
def test_secret_key_names(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["name", "path", "url", "command", "id", "user"])
def test_ordinary_key_names(key: str) -> None:
    assert not is_secret_key(key)


def test_mask_data_masks_secret_keys_recursively() -> None:
    masker = Masker([KEY])
    data = {
        "url": "https://example.com",
        "headers": {"Authorization": "Bearer whatever", "Accept": "json"},
        "token": "tok-value",
        "nested": [
            {"api_key": "short"},
            {"password": "hunter2", "user": "me"},
            ["plain", f"contains {KEY}"],
            ({"Token": 12345},),
        ],
        "count": 3,
        "empty_token": "",
        "note": f"my key is {KEY}",
    }
    masked = masker.mask_data(data)
    assert masked == {
        "url": "https://example.com",
        "headers": {"Authorization": MASK, "Accept": "json"},
        "token": MASK,
        "nested": [
            {"api_key": MASK},
            {"password": MASK, "user": "me"},
            ["plain", f"contains {MASK}"],
            [{"Token": MASK}],
        ],
        "count": 3,
        "empty_token": "",
        "note": f"my key is {MASK}",
    }
    assert data["token"] == "tok-value"  # the input is not modified
    assert "hunter2" not in json.dumps(masked)


def test_mask_data_masks_structured_values_under_secret_keys() -> None:
    masked = Masker().mask_data({"auth": {"password": ["a", "b"]}, "secret": {"x": 1}})
    assert masked == {"auth": {"password": MASK}, "secret": MASK}


def test_mask_data_leaves_other_types_alone() -> None:
    masker = Masker([KEY])
    assert masker.mask_data(None) is None
    assert masker.mask_data(42) == 42
    assert masker.mask_data(KEY) == MASK


# --------------------------------------------------------------------------- logging


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_text_logs_mask_secrets_in_messages_and_args(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO", "text", Masker([TOKEN, KEY]))
    log = logging.getLogger("echo_bot.test")
    log.info("calling https://api.telegram.org/bot%s/getMe", TOKEN)
    log.warning(f"key {KEY} rejected")
    log.debug("below the level %s", TOKEN)
    err = capsys.readouterr().err
    assert TOKEN not in err and KEY not in err
    lines = err.splitlines()
    assert len(lines) == 2
    assert lines[0].endswith(
        f"INFO echo_bot.test: calling https://api.telegram.org/bot{MASK}/getMe"
    )
    assert lines[1].endswith(f"WARNING echo_bot.test: key {MASK} rejected")


@pytest.mark.usefixtures("restore_logging")
def test_text_logs_mask_secrets_in_tracebacks(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO", "text", Masker([TOKEN]))
    log = logging.getLogger("echo_bot.test")

    def fail() -> None:
        raise RuntimeError(f"401 Unauthorized for /bot{TOKEN}/getUpdates")

    try:
        fail()
    except RuntimeError:
        log.exception("polling failed")
    err = capsys.readouterr().err
    assert TOKEN not in err
    assert "polling failed" in err
    assert "Traceback (most recent call last)" in err
    assert f"RuntimeError: 401 Unauthorized for /bot{MASK}/getUpdates" in err


@pytest.mark.usefixtures("restore_logging")
def test_json_logs_are_one_object_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("DEBUG", "json", Masker([TOKEN]))
    log = logging.getLogger("echo_bot.json")
    log.info("hello %s", "world")
    log.warning("multi\nline with token %s", TOKEN, extra={"trace_id": "tr-1"})
    try:
        raise ValueError(f"bad {TOKEN}")
    except ValueError:
        log.exception("it broke")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 3, err
    records = [json.loads(line) for line in lines]
    assert [r["level"] for r in records] == ["INFO", "WARNING", "ERROR"]
    assert records[0]["message"] == "hello world"
    assert records[0]["component"] == "echo_bot.json"
    assert records[0]["ts"].endswith("Z")
    assert records[1]["message"] == f"multi\nline with token {MASK}"
    assert records[1]["trace_id"] == "tr-1"
    assert "Traceback" in records[2]["exc"]
    assert f"ValueError: bad {MASK}" in records[2]["exc"]
    assert TOKEN not in err


@pytest.mark.usefixtures("restore_logging")
def test_logging_level_filters(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("WARNING", "text", Masker())
    logging.getLogger("echo_bot.x").info("quiet")
    logging.getLogger("echo_bot.x").error("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err and "loud" in err
