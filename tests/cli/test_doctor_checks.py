"""`echo-bot doctor` as the user ran it, against the fake Bot API: a rejected token, the
service's environment file, messages stranded for a channel that does not run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from echo_bot.events import Address, OutboundMessage
from echo_bot.secrets import Masker
from echo_bot.store import DB_FILENAME, Database, Store, Tx
from echo_bot.store.schema import MIGRATIONS
from tests.conftest import ROOT, echo_bot_env, run_echo_bot
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegramAPI, Webhook

TOKEN = "123456:DOCTOR-test-token"


def adding(message: OutboundMessage) -> Callable[[Tx], None]:
    """Store work that queues ``message`` (bound now, not when the work runs)."""
    return lambda tx: tx.outbox.add(message)


async def doctor(*args: str, **env: str) -> tuple[int, str]:
    """The real command, run while the fake answers in this event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "echo_bot", "doctor", *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, env=echo_bot_env(**env), cwd=ROOT,
    )  # fmt: skip
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


def line(output: str, name: str) -> str:
    """The one line of doctor's output that checks ``name``."""
    (found,) = [row for row in output.splitlines() if f"] {name}" in row]
    return found


def check_config(config: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``echo-bot check-config`` as the user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "echo_bot", "check-config", "--config", str(config)],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=echo_bot_env(**env),
    )  # fmt: skip


def telegram_config(tmp_path: Path, api: FakeTelegramAPI) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'[telegram]\nenabled = true\napi_base = "{api.base_url}"\n')
    return path


def telegram_line(output: str) -> str:
    (line,) = [line for line in output.splitlines() if "] telegram" in line]
    return line


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_doctor_says_what_telegram_says_of_its_webhook_deliveries(tmp_path: Path) -> None:
    """In webhook mode a bot Telegram cannot reach hears nothing, and says nothing: doctor
    reads getWebhookInfo (no webhook, another URL, the last delivery's error)."""
    url = "https://bot.example.org/telegram"
    async with FakeTelegramAPI(token=TOKEN) as api:
        config = tmp_path / "config.toml"
        config.write_text(
            f'[telegram]\nenabled = true\napi_base = "{api.base_url}"\nmode = "webhook"\n'
            f'webhook_url = "{url}"\n'
        )
        env = {"TELEGRAM_BOT_TOKEN": TOKEN, "TELEGRAM_WEBHOOK_SECRET": "s" * 32}
        args = ("--config", str(config), "--state-dir", str(tmp_path / "st"))

        async def webhook_line() -> str:
            _, out = await doctor(*args, **env)
            (line,) = [line for line in out.splitlines() if "] telegram webhook" in line]
            return line

        assert "no webhook registered with Telegram" in await webhook_line()
        api.webhook = Webhook(url="https://old.example.org/telegram")
        assert "not to https://bot.example.org/telegram" in await webhook_line()
        api.webhook = Webhook(url=url)
        api.webhook_error = (int(time.time()) - 120, "SSL error: certificate verify failed")
        failed = await webhook_line()
        assert failed.startswith("[FAIL]") and "certificate verify failed" in failed, failed
        assert "2 min ago" in failed and TOKEN not in failed
        api.webhook_error = (int(time.time()) - 86_400, "Connection refused")  # yesterday's
        assert (await webhook_line()).startswith("[  ok] telegram webhook")


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_doctor_fails_when_the_bot_api_rejects_the_token_with_401(tmp_path: Path) -> None:
    async with FakeTelegramAPI(token=TOKEN) as api:
        config = telegram_config(tmp_path, api)
        wrong = "654321:REVOKED-token-value"
        code, out = await doctor(
            "--config", str(config), "--state-dir", str(tmp_path / "st"),
            TELEGRAM_BOT_TOKEN=wrong,
        )  # fmt: skip
        assert [call.method for call in api.calls] == ["getMe"]
    assert code == 1, out
    line = telegram_line(out)
    assert line.startswith("[FAIL]")
    assert "rejected the token" in line and "HTTP 401" in line
    assert "TELEGRAM_BOT_TOKEN" in line and "BotFather" in line
    assert "All good." not in out and "Fix: telegram." in out
    assert wrong not in out and "REVOKED" not in out


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_doctor_fails_when_the_bot_api_answers_404_for_the_token(tmp_path: Path) -> None:
    async with FakeTelegramAPI(token=TOKEN) as api:
        api.fail_next("getMe", status=404)  # what Telegram answers for a malformed token
        config = telegram_config(tmp_path, api)
        code, out = await doctor(
            "--config", str(config), "--state-dir", str(tmp_path / "st"),
            TELEGRAM_BOT_TOKEN=TOKEN,
        )  # fmt: skip
    assert code == 1, out
    line = telegram_line(out)
    assert line.startswith("[FAIL]") and "rejected the token" in line and "HTTP 404" in line
    assert TOKEN not in out


@pytest.mark.slow  # its echo-bot processes: 1.5 s of CPU or more (--cpu-durations)
async def test_doctor_reads_the_token_from_the_service_env_file(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text(f'# /etc/echo-bot/env\nTELEGRAM_BOT_TOKEN="{TOKEN}"\n')
    env_file.chmod(0o600)
    async with FakeTelegramAPI(token=TOKEN) as api:
        config = telegram_config(tmp_path, api)
        args = ("--config", str(config), "--state-dir", str(tmp_path / "st"))
        without, out_without = await doctor(*args)
        code, out = await doctor(*args, "--env-file", str(env_file))
        assert [call.token for call in api.calls] == [TOKEN], "asked once, with the file's token"
    assert without == 1 and "TELEGRAM_BOT_TOKEN" in out_without, out_without
    assert code == 0, out
    assert telegram_line(out).startswith("[  ok]") and "@echo_test_bot" in out
    assert "All good." in out
    assert TOKEN not in out


async def test_doctor_with_an_unreadable_env_file_is_one_line_exit_2(tmp_path: Path) -> None:
    code, out = await doctor("--state-dir", str(tmp_path / "st"), "--env-file", str(tmp_path))
    assert code == 2 and out.startswith("echo-bot: --env-file") and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1


def test_doctor_warns_about_queued_messages_for_a_channel_that_is_not_running(
    tmp_path: Path,
) -> None:
    state = tmp_path / "st"
    db = Database(state / DB_FILENAME)
    db.open_sync()
    try:
        for n in range(3):  # what a cron job delivering to Telegram left while it was off
            message = OutboundMessage(to=Address.parse("telegram:42"), text=f"report {n}")
            Store(db, Masker()).run_sync(adding(message))
    finally:
        db.close_sync()
    code, out = asyncio.run(doctor("--state-dir", str(state)))
    assert code == 0, out
    (line,) = [line for line in out.splitlines() if "] outbox" in line]
    assert line.startswith("[warn]")
    assert "3 message(s) for telegram" in line and "not enabled" in line
    assert "All good." not in out


def make_store(state: Path, queued: int = 0) -> Path:
    path = state / DB_FILENAME
    db = Database(path)
    db.open_sync()
    try:
        for n in range(queued):
            message = OutboundMessage(to=Address.parse("cli:local"), text=f"note {n} " * 40)
            Store(db, Masker()).run_sync(adding(message))
    finally:
        db.close_sync()  # the last connection: the WAL is checkpointed into the file
    assert not path.with_name(path.name + "-wal").exists()
    return path


def line_of(output: str, name: str) -> str:
    (line,) = [line for line in output.splitlines() if f"] {name} " in line]
    return line


def test_doctor_reads_a_sound_store_read_only_and_counts_its_outbox(tmp_path: Path) -> None:
    path = make_store(tmp_path / "st", queued=2)
    before = path.read_bytes()
    code, out = asyncio.run(doctor("--state-dir", str(tmp_path / "st")))
    assert code == 0, out
    assert line_of(out, "store").endswith(
        f"] store      {path}: quick check ok, schema version {len(MIGRATIONS)}"
    )
    assert line_of(out, "outbox") == "[warn] outbox     " + (
        "2 message(s) for cli wait for a terminal (`echo-bot chat`)"
    )
    assert path.read_bytes() == before


def test_doctor_on_postgresql_with_its_url_unset_says_nothing_of_the_old_sqlite_outbox(
    tmp_path: Path,
) -> None:
    """A move to PostgreSQL leaves the SQLite file behind: its outbox is not the store's."""
    make_store(tmp_path / "st", queued=2)
    config = tmp_path / "echo-bot.toml"
    config.write_text('[storage]\nengine = "postgres"\n')
    args = ("--config", str(config), "--state-dir", str(tmp_path / "st"))
    code, out = asyncio.run(doctor(*args, ECHO_BOT_DATABASE_URL=""))
    assert code == 1, out
    assert "ECHO_BOT_DATABASE_URL is not set" in line_of(out, "store")
    assert "] outbox " not in out, out


def test_doctor_fails_on_a_store_a_newer_echo_bot_wrote_and_notes_one_behind(
    tmp_path: Path,
) -> None:
    """A rollback: the daemon refuses a store a newer version wrote, and doctor says so
    (it said ok); a store one version behind is migrated at the next start."""
    path = make_store(tmp_path / "st", queued=0)
    for version, verdict, said in (
        (len(MIGRATIONS) + 1, 1, "newer than this echo-bot"),
        (len(MIGRATIONS) - 1, 0, f"migrated to {len(MIGRATIONS)} at the next start"),
    ):
        with contextlib.closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(version)])
        code, out = asyncio.run(doctor("--state-dir", str(tmp_path / "st")))
        assert code == verdict and said in line_of(out, "store"), out


def test_doctor_fails_on_a_store_whose_pages_are_damaged(tmp_path: Path) -> None:
    path = make_store(tmp_path / "st", queued=40)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (page,) = conn.execute(  # a page of an index of the outbox
            "SELECT min(pageno) FROM dbstat WHERE name IN"
            " (SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'outbox')"
        ).fetchone()
    with path.open("r+b") as f:  # now no b-tree page: its cells point past its end
        f.seek((page - 1) * page_size)
        f.write(b"\x0d" + b"\xff" * 100)
    code, out = asyncio.run(doctor("--state-dir", str(tmp_path / "st")))
    assert code == 1, out
    line = line_of(out, "store")
    assert line.startswith(f"[FAIL] store      {path} is damaged (*** in database main ***")
    assert out.splitlines()[-1] == "Fix: store."
    assert "restore a backup (systemd/README.md)" in out


def test_doctor_fails_on_a_file_that_is_no_store(tmp_path: Path) -> None:
    state = tmp_path / "st"
    state.mkdir()
    path = state / DB_FILENAME
    path.write_bytes(b"not SQLite at all " * 300)
    code, out = asyncio.run(doctor("--state-dir", str(state)))
    assert code == 1, out
    assert line_of(out, "store") == f"[FAIL] store      cannot read {path}: file is not a database"
    assert line_of(out, "outbox") == (
        f"[warn] outbox     cannot read the outbox of {path}: file is not a database"
    )
    assert out.splitlines()[-1] == "Fix: store."


def test_an_empty_store_file_is_said_to_be_empty_and_left_as_it_is(tmp_path: Path) -> None:
    """0 bytes (a copy made without its -wal file, a restore that failed): said, not
    taken for "nothing yet", and not written by the commands that read it."""
    state = tmp_path / "st"
    state.mkdir()
    path = state / DB_FILENAME
    path.touch()
    code, out = asyncio.run(doctor("--state-dir", str(state)))
    assert code == 0, out
    assert line_of(out, "store").startswith(f"[warn] store      {path} is empty (0 bytes)")
    assert "restore a backup" in line_of(out, "store") and "] outbox " not in out
    status = run_echo_bot("status", "--state-dir", str(state))
    assert f"{path} is empty (0 bytes)" in status.stdout, status.stdout
    listed = run_echo_bot("reminders", "list", "--state-dir", str(state))
    assert listed.returncode == 0 and "is empty (0 bytes)" in listed.stderr
    assert path.stat().st_size == 0


def test_doctor_reports_how_much_the_inbox_holds_against_its_cap(tmp_path: Path) -> None:
    state = tmp_path / "st"
    config = tmp_path / "config.toml"
    config.write_text('[media]\ninbox_max = "1MB"\n')
    args = ("--config", str(config), "--state-dir", str(state))
    code, out = asyncio.run(doctor(*args))
    inbox = state / "workspace" / "inbox"
    assert line_of(out, "media") == (
        f"[  ok] media      {inbox}: no files yet (cap 1.0 MB, [media] inbox_max)"
    )
    day = inbox / "telegram-77" / "2026-12-03"
    day.mkdir(parents=True)
    (day / "a-1-x.bin").write_bytes(b"x" * 300_000)
    (day / "a-2-y.bin").write_bytes(b"y" * 200_000)
    code, out = asyncio.run(doctor(*args))
    assert code == 0, out
    assert line_of(out, "media") == (
        f"[  ok] media      {inbox}: 500.0 KB in 2 file(s), cap 1.0 MB ([media] inbox_max)"
    )
    (inbox / "2026-11-01").mkdir()  # the older layout counts too
    (inbox / "2026-11-01" / "b-1-z.bin").write_bytes(b"z" * 600_000)
    code, out = asyncio.run(doctor(*args))
    line = line_of(out, "media")
    assert line.startswith(f"[warn] media      {inbox}: 1.1 MB in 3 file(s), cap 1.0 MB")
    assert "full, new files are refused until old days are pruned" in line
    assert code == 0 and out.splitlines()[-1].startswith("Works, but look at:")
    assert out.splitlines()[-1].endswith(" media."), out


async def test_doctor_shows_the_console_and_warns_when_it_is_open_to_the_network(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.toml"
    state = ("--config", str(config), "--state-dir", str(tmp_path / "st"))
    config.write_text("[console]\nenabled = true\n")
    _code, out = await doctor(*state)
    (line,) = [row for row in out.splitlines() if "] console " in row]
    assert line.startswith("[  ok]") and "http://127.0.0.1:8080/console/" in line, out
    config.write_text('[http]\nhost = "0.0.0.0"\n[console]\nenabled = true\n')
    _code, out = await doctor(*state)
    (line,) = [row for row in out.splitlines() if "] console " in row]
    assert line.startswith("[warn]") and "plain HTTP on 0.0.0.0:8080" in line, out


def test_check_config_reads_the_service_env_file_as_the_install_steps_run_it(
    tmp_path: Path,
) -> None:
    """systemd/README.md runs check-config under sudo, which does not load the service's
    environment file: with --env-file it checks what the service will have."""
    config = tmp_path / "echo-bot.toml"
    config.write_text("[telegram]\nenabled = true\n")
    env_file = tmp_path / "env"
    env_file.write_text(f"TELEGRAM_BOT_TOKEN={TOKEN}\n")
    args = ("check-config", "--config", str(config), "--state-dir", str(tmp_path / "st"))
    without = run_echo_bot(*args)
    assert without.returncode == 2 and "TELEGRAM_BOT_TOKEN" in without.stderr
    checked = run_echo_bot(*args, "--env-file", str(env_file))
    assert checked.returncode == 0, checked.stderr
    assert TOKEN not in checked.stdout + checked.stderr


async def test_doctor_asks_the_model_server_with_the_key_and_names_a_refused_one(
    tmp_path: Path,
) -> None:
    """The LLM check asks for the model listing as the daemon would (with its key): a
    wrong key fails (any answer counted as ok), a model the server does not list warns,
    and neither the key nor a password in base_url is printed."""
    async with FakeOpenAI(api_key="sk-right", model="gpt-test", require_key=True) as llm:
        where = llm.base_url.replace("http://", "http://admin:hunter2pass@")
        config = tmp_path / "config.toml"
        for model in ("gpt-test", "gpt-other"):
            config.write_text(f'[openai]\nbase_url = "{where}"\nmodel = "{model}"\n')
            args = ("--config", str(config), "--state-dir", str(tmp_path / "st"))
            code, out = await doctor(*args, OPENAI_API_KEY="sk-right")
            found = line(out, "llm")
            if model == "gpt-test":
                assert found.startswith("[  ok]") and "gpt-test is there" in found, out
                assert code == 0, out
            else:
                assert found.startswith("[warn]") and "gpt-other is not among" in found
        code, out = await doctor(*args, OPENAI_API_KEY="sk-wrong")
    assert code == 1 and "refused the key (HTTP 401)" in line(out, "llm"), out
    assert "sk-wrong" not in out and "sk-right" not in out and "hunter2pass" not in out


def test_doctor_fails_a_store_another_user_owns_than_the_daemons(tmp_path: Path) -> None:
    """A restore done with `sudo cp`: the file is root's, the service's user cannot open
    it, and doctor (run with sudo) read it fine and said ok."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user takes root")
    path = make_store(tmp_path / "st")
    os.chown(tmp_path / "st", 65534, 65534)  # the service's user owns its state dir
    code, out = asyncio.run(doctor("--state-dir", str(tmp_path / "st")))
    assert code == 1 and "echo-bot.sqlite3 not owned by the state dir's owner" in out, out
    os.chown(path, 65534, 65534)
    code, out = asyncio.run(doctor("--state-dir", str(tmp_path / "st")))
    assert "not owned" not in out, out
    # Its own look leaves nothing of root's behind (the WAL files it made are theirs),
    # nor does a backup taken with sudo.
    assert {f.stat().st_uid for f in (tmp_path / "st").glob("echo-bot.sqlite3*")} == {65534}
    for made in (tmp_path / "st").glob("echo-bot.sqlite3-*"):
        made.unlink()
    backup = run_echo_bot("backup", str(tmp_path / "copy.sqlite3"), "--state-dir",
                          str(tmp_path / "st"))  # fmt: skip
    assert backup.returncode == 0, backup.stderr
    assert {f.stat().st_uid for f in (tmp_path / "st").glob("echo-bot.sqlite3*")} == {65534}
