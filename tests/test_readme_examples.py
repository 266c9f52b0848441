"""The README's examples work as written, checked with the real `echo-bot` process.

Every ```toml block must pass `echo-bot check-config`. A block is a whole config unless
its first line reads ``# add to echo-bot.toml, with [a] and [b] from above``: then it is
a fragment, checked together with the tables it names, taken from the README's earlier
blocks that define them (``[telegram]`` from the Telegram example, and so on).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT, echo_bot_cmd, echo_bot_env, run_echo_bot
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.ports import free_port

README = ROOT / "README.md"
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>\w*)[ \t]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S
)
FRAGMENT = re.compile(r"^# add to echo-bot\.toml, with (?P<needs>.+) from above$")
HEADER = re.compile(r"^\[{1,2}(?P<name>[A-Za-z0-9_.]+)\]{1,2}\s*(?:#.*)?$")
ENV_NAME = re.compile(r'_env\s*=\s*"(?P<name>[A-Z][A-Z0-9_]*)"')
TOKEN = "123456789:README-example-token"


@dataclass(frozen=True)
class Block:
    index: int
    lang: str
    text: str


def readme_blocks(lang: str) -> list[Block]:
    found = []
    for index, match in enumerate(FENCE.finditer(README.read_text())):
        if match["lang"] == lang:
            found.append(Block(index, lang, textwrap.dedent(match["body"])))
    return found


def table_text(text: str, name: str) -> str | None:
    """The lines of table ``[name]`` in ``text``: its header up to the next header."""
    lines = text.splitlines()
    for start, line in enumerate(lines):
        header = HEADER.match(line.strip())
        if header and header["name"] == name and not line.lstrip().startswith("[["):
            end = start + 1
            while end < len(lines) and not HEADER.match(lines[end].strip()):
                end += 1
            return "\n".join(lines[start:end]) + "\n"
    return None


def as_config(block: Block, earlier: list[Block]) -> str:
    """The block as a whole config: a fragment gets the tables it names from above."""
    first = block.text.splitlines()[0] if block.text.strip() else ""
    fragment = FRAGMENT.match(first)
    if fragment is None:
        return block.text
    parts = [block.text]
    for name in re.findall(r"\[([A-Za-z0-9_.]+)\]", fragment["needs"]):
        found = next((t for b in earlier if (t := table_text(b.text, name)) is not None), None)
        assert found is not None, f"block {block.index} needs [{name}], defined by no block above"
        parts.append(found)
    return "\n".join(parts)


def env_for(text: str) -> dict[str, str]:
    """The secrets the README tells the reader to set: every variable a `*_env` key
    names, and the Telegram token (exported in the Telegram steps)."""
    names = {m["name"] for m in ENV_NAME.finditer(text)} | {"TELEGRAM_BOT_TOKEN"}
    env = {name: f"value-of-{name.lower()}" for name in names}
    env["TELEGRAM_BOT_TOKEN"] = TOKEN
    for name, prefix in (("SLACK_BOT_TOKEN", "xoxb-"), ("SLACK_APP_TOKEN", "xapp-")):
        if name in env:  # shaped as Slack's: check-config refuses a token of another kind
            env[name] = prefix + env[name]
    if "DISCORD_BOT_TOKEN" in env:  # shaped as a bot's token: three parts
        env["DISCORD_BOT_TOKEN"] = "MTAx.value-of.discord_bot_token"
    if "ECHO_BOT_DATABASE_URL" in env:  # as the README's PostgreSQL section exports it
        env["ECHO_BOT_DATABASE_URL"] = "postgresql://echo:secret@db.example:5432/echo_bot"
    return env


TOML_BLOCKS = readme_blocks("toml")


def test_the_readme_has_toml_examples() -> None:
    assert len(TOML_BLOCKS) >= 6


@pytest.mark.parametrize("position", range(len(TOML_BLOCKS)))
def test_every_toml_example_in_the_readme_passes_check_config(
    tmp_path: Path, position: int
) -> None:
    block = TOML_BLOCKS[position]
    text = as_config(block, TOML_BLOCKS[:position])
    path = tmp_path / "echo-bot.toml"
    path.write_text(text)
    result = run_echo_bot(
        "check-config", "--config", str(path), "--state-dir", str(tmp_path / "st"),
        env=echo_bot_env(**env_for(text)),
    )  # fmt: skip
    assert result.returncode == 0, f"README block {block.index}:\n{text}\n{result.stderr}"
    assert "— valid" in result.stdout


# -- the GitHub route, end to end ------------------------------------------------------------
def ci_config(api: FakeTelegramAPI, port: int) -> str:
    """The README's `ci` example as a reader completes it, Telegram pointed at the fake."""
    position = next(i for i, b in enumerate(TOML_BLOCKS) if 'name = "ci"' in b.text)
    text = as_config(TOML_BLOCKS[position], TOML_BLOCKS[:position])
    text = text.replace("[telegram]\n", f'[telegram]\napi_base = "{api.base_url}"\n', 1)
    return text + f"\n[http]\nport = {port}\n"


def ci_payload() -> str:
    [payload] = [b.text for b in readme_blocks("json") if "workflow_run" in b.text]
    return payload


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_the_readmes_github_example_is_accepted_by_webhook_send(tmp_path: Path) -> None:
    """`echo-bot webhook send ci --data payload.json`, as the README shows it, reaches the
    route with the event its filter waits for: 202 accepted, not 200 "ignored"."""
    config, state, data = tmp_path / "echo-bot.toml", tmp_path / "st", tmp_path / "payload.json"
    data.write_text(ci_payload())
    async with FakeTelegramAPI(token=TOKEN) as api:
        config.write_text(ci_config(api, free_port()))
        env = echo_bot_env(**env_for(config.read_text()))
        daemon = await asyncio.create_subprocess_exec(
            *echo_bot_cmd("run", "--config", str(config), "--state-dir", str(state)),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
        )  # fmt: skip
        try:
            assert daemon.stderr is not None
            async with asyncio.timeout(30):
                while not (line := (await daemon.stderr.readline()).decode()).startswith(
                    "stop with"
                ):
                    assert line, "the daemon exited before it was ready"
            command = ("webhook", "send", "ci", "--data", str(data), "--config", str(config))
            send = await asyncio.create_subprocess_exec(
                *echo_bot_cmd(*command),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT,
            )  # fmt: skip
            out, err = await asyncio.wait_for(send.communicate(), 30)
            assert send.returncode == 0, out.decode() + err.decode()
            assert out.decode().startswith("HTTP 202"), out.decode()
            assert '"accepted"' in out.decode() and "ignored" not in out.decode()
            assert "event: workflow_run (the route's events filter" in err.decode()
            # The route's prompt ran and its answer went to the README's chat.
            await api.wait_for_call(
                "sendMessage", lambda c: str(c.params.get("chat_id")) == "123456789", timeout=30
            )
        finally:
            daemon.terminate()
            assert await asyncio.wait_for(daemon.wait(), 30) == 0


def test_webhook_send_asks_for_an_event_when_the_route_takes_several(tmp_path: Path) -> None:
    config = tmp_path / "echo-bot.toml"
    config.write_text(
        '[[webhook.routes]]\nname = "ci"\nauth = "github"\nsecret_env = "CI_WEBHOOK_SECRET"\n'
        'events = ["push", "workflow_run"]\nprompt = "x"\n'
    )
    data = tmp_path / "payload.json"
    data.write_text("{}")
    result = run_echo_bot(
        "webhook", "send", "ci", "--data", str(data), "--config", str(config),
        env=echo_bot_env(CI_WEBHOOK_SECRET="s"),
    )  # fmt: skip
    assert result.returncode == 2, result
    assert "push, workflow_run" in result.stdout and "--event" in result.stdout


# -- the MCP example -------------------------------------------------------------------------
@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
def test_the_readmes_mcp_example_lists_its_notes_tools_and_answers_as_written(
    tmp_path: Path,
) -> None:
    """The README's `[[mcp.servers]]` example, as written, with a fresh HOME and outside
    the checkout, after `pip install` with the extra in an activated virtual environment
    (its `python3` first on PATH): `mcp list` lists the example server's notes tools and
    nothing else, and a piped chat adds a note (asked first), lists it and reads it."""
    [block] = [b for b in TOML_BLOCKS if "[[mcp.servers]]" in b.text]
    readme = README.read_text()
    assert "/tool notes__list_notes {}" in readme and "notes__add_note" in readme
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    config = work / "echo-bot.toml"
    config.write_text(block.text)
    venv_bin = str(Path(sys.executable).parent)
    env = echo_bot_env(HOME=str(home), PATH=f"{venv_bin}:{echo_bot_env()['PATH']}")
    where = ("--config", str(config), "--state-dir", str(tmp_path / "st"))

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            echo_bot_cmd(*args, *where), input=input, capture_output=True, text=True,
            timeout=120, env=env, cwd=work, stdin=None if input else subprocess.DEVNULL,
        )  # fmt: skip

    listing = run("mcp", "list")
    assert listing.returncode == 0, listing.stdout + listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0] == "notes (stdio): ready, 3 tools", listing.stdout
    assert [line.split() for line in lines[1:]] == [
        ["notes__add_note", "write", "default"],
        ["notes__list_notes", "read", "owner"],
        ["notes__read_note", "read", "owner"],
    ]

    script = (
        '/tool notes__add_note {"title": "shopping", "text": "milk, bread"}\n'
        "y\n"
        "/tool notes__list_notes {}\n"
        '/tool notes__read_note {"title": "shopping"}\n'
    )
    chat = run("chat", input=script)
    assert chat.returncode == 0, chat.stdout + chat.stderr
    out = chat.stdout
    assert 'Approve notes__add_note(text="milk, bread", title="shopping")? [y/N]' in out, out
    assert "✅ Approved" in out and "TOOL_UNAVAILABLE" not in out, out
    assert "\nshopping\n" in out and "milk, bread" in out.split("Approved", 1)[1], out
    assert (home / "notes" / "shopping.md").read_text() == "milk, bread"
