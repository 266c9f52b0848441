"""`echo-bot run` as a real process on Matrix, against a real Synapse: SIGKILL after a
sync answered a burst and before the sync token moved past it loses and repeats
nothing; and two daemons on one PostgreSQL store sync the account one at a time, the
second taking over when the first is killed."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from echo_bot.brains.rules import no_match_hint
from echo_bot.store import make_database
from tests.conftest import echo_bot_env, read_engine, run_echo_bot
from tests.matrix_people import Person, open_room
from tests.matrix_server import Registered, Synapse, unique
from tests.proc import Daemon
from tests.waiting import eventually

pytestmark = pytest.mark.slow

BURST = 60  # more than one sync answer carries per room (sync.TIMELINE_LIMIT)


def config_text(
    synapse: Synapse, bot: Registered, owner: Person, extra: str = "", matrix: str = ""
) -> str:
    return f"""{extra}
[matrix]
enabled = true
homeserver = "{synapse.url}"
user_id = "{bot.user_id}"
allowed_users = ["{owner.user_id}"]
{matrix}
[http]
port = 0
"""


@contextlib.asynccontextmanager
async def people(synapse: Synapse, tmp_path: Path) -> AsyncIterator[tuple[Registered, Person, str]]:
    """The bot's account, and its owner with an encrypted room the bot is invited to."""
    bot = await asyncio.to_thread(synapse.register, unique("echo"), "bot-password")
    owner = Person(synapse, "owner", tmp_path / "owner")
    try:
        await owner.step()
        room_id = await open_room(owner, [bot.user_id])
        async with owner.syncing():
            yield bot, owner, room_id
    finally:
        await owner.client.close()


async def bot_ready(owner: Person, room_id: str, bot: Registered) -> None:
    """The bot in the room and its device known to the owner (what is said is encrypted
    for it)."""

    def joined_and_known() -> bool:
        room = owner.client.rooms.get(room_id)
        devices = owner.client.device_store.active_user_devices(bot.user_id)
        return bool(room and bot.user_id in room.users and list(devices))

    await eventually(joined_and_known, timeout=60, what="the bot joined, its device known")


HINT = no_match_hint("!")  # the rules brain's answer, as Matrix types commands


def replies(owner: Person, room_id: str, bot: Registered) -> list[str]:
    return [t for t in owner.received(room_id, bot.user_id) if t == HINT]


async def all_sent(url: str, state: Path) -> bool:
    """Whether the PostgreSQL store at ``url`` has no reply left to send."""
    engine = make_database("postgres", state_dir=state, url=url)
    queued: int = await asyncio.to_thread(read_engine, engine, lambda tx: tx.outbox.pending_count())
    return queued == 0


def stored(state: Path, bot: Registered) -> tuple[int, str | None]:
    """The Matrix inbounds the store holds, and the sync token it keeps."""
    with contextlib.closing(sqlite3.connect(state / "echo-bot.sqlite3", timeout=10)) as conn:
        (count,) = conn.execute("SELECT count(*) FROM inbox WHERE channel = 'matrix'").fetchone()
        row = conn.execute(
            "SELECT value FROM meta WHERE key = ?", [f"note:matrix-sync:{bot.user_id}"]
        ).fetchone()
    return int(count), None if row is None else str(row[0])


async def test_sigkill_between_a_sync_and_its_commit_loses_and_repeats_nothing(
    synapse: Synapse, tmp_path: Path
) -> None:
    """A burst is sent while the daemon is down, so its first sync brings it in one
    batch; the daemon is killed as soon as part of the batch is stored, before the token
    moved past it (checked: a kill that missed that window is tried again). After a
    restart every message is answered exactly once."""
    state, config = tmp_path / "state", tmp_path / "config.toml"
    async with people(synapse, tmp_path) as (bot, owner, room_id):
        config.write_text(config_text(synapse, bot, owner))
        daemon = Daemon(config, state, echo_bot_env(MATRIX_ACCESS_TOKEN=bot.access_token))
        await daemon.start()
        await bot_ready(owner, room_id, bot)
        await owner.say(room_id, "first words")
        await eventually(lambda: len(replies(owner, room_id, bot)) == 1, timeout=60,
                         what="the first answer")  # fmt: skip
        sent = 1
        landed = 0
        for _attempt in range(5):
            await daemon.stop()
            _, token_before = await asyncio.to_thread(stored, state, bot)
            for index in range(BURST):
                await owner.say(room_id, f"message {sent + index}")
            sent += BURST
            daemon = Daemon(config, state, daemon.env)
            await daemon.start()

            async with asyncio.timeout(60):  # looks as often as it can: the window is short
                while (await asyncio.to_thread(stored, state, bot))[0] <= sent - BURST:
                    pass
            await daemon.kill()
            count, token = await asyncio.to_thread(stored, state, bot)
            if count < sent and token == token_before:
                landed += 1  # killed after the sync, before the token moved past it
                break
        assert landed, "no kill landed between a sync and its commit in 5 tries"
        daemon = Daemon(config, state, daemon.env)
        await daemon.start()
        try:
            await eventually(lambda: len(replies(owner, room_id, bot)) >= sent, timeout=120,
                             what=f"{sent} answers")  # fmt: skip
            await owner.say(room_id, "and one more")  # answered after any repeat would be
            await eventually(lambda: len(replies(owner, room_id, bot)) >= sent + 1,
                             timeout=60, what="the last answer")  # fmt: skip
        finally:
            await daemon.stop()
        count, _ = await asyncio.to_thread(stored, state, bot)
    assert count == sent + 1
    assert len(replies(owner, room_id, bot)) == sent + 1, "an answer was repeated"


async def test_two_daemons_on_one_database_sync_one_at_a_time_and_take_over(
    synapse: Synapse, tmp_path: Path
) -> None:
    """Two daemons on one PostgreSQL store, each its own device of the bot account (a
    password login each): one syncs, the other stands by; killed, the first is taken
    over within the lease, the messages sent meanwhile are read (the standby's device
    got the room keys too) and every message is answered once."""
    from tests.postgres import fresh_database

    password = "bot-password"
    with fresh_database() as url:
        async with people(synapse, tmp_path) as (bot, owner, room_id):
            extra = '[storage]\nengine = "postgres"\n'
            daemons = []
            for name in ("a", "b"):
                config = tmp_path / f"{name}.toml"
                login = 'password_env = "MATRIX_PASSWORD"\naccess_token_env = "NO_MATRIX_TOKEN"'
                bot_section = f'[bot]\ninstance = "{name}"\n'
                config.write_text(config_text(synapse, bot, owner, bot_section + extra, login))
                env = echo_bot_env(MATRIX_PASSWORD=password, ECHO_BOT_DATABASE_URL=url)
                daemons.append(Daemon(config, tmp_path / f"state-{name}", env))
            first, second = daemons
            try:
                await first.start()
                await eventually(lambda: first.said("matrix: syncing now"), timeout=30,
                                 what=lambda: "\n".join(first.lines))  # fmt: skip
                await second.start()
                await eventually(lambda: second.said("another daemon syncs"), timeout=30,
                                 what=lambda: "\n".join(second.lines))  # fmt: skip
                await bot_ready(owner, room_id, bot)
                await eventually(
                    lambda: len(list(owner.client.device_store.active_user_devices(bot.user_id)))
                    == 2, timeout=30, what="both of the bot's devices known to the owner",
                )  # fmt: skip
                await owner.say(room_id, "one thing")
                await eventually(lambda: len(replies(owner, room_id, bot)) == 1, timeout=60,
                                 what="the first answer")  # fmt: skip
                # Killed once that answer is stored as sent: an answer still in flight at
                # a kill is sent again by the daemon that takes over (its device cannot
                # reuse the first one's transaction id), the one repeat the design allows
                # (DESIGN: delivery is at-least-once at a kill). Seen when the machine was busy.
                await eventually(lambda: all_sent(url, tmp_path), timeout=30,
                                 what="the first answer stored as sent")  # fmt: skip
                await first.kill()
                await owner.say(room_id, "another thing")
                await owner.say(room_id, "a third thing")
                await eventually(lambda: second.said("matrix: syncing now"), timeout=30,
                                 what=lambda: "\n".join(second.lines))  # fmt: skip
                await eventually(lambda: len(replies(owner, room_id, bot)) >= 3, timeout=60,
                                 what=lambda: owner.received(room_id, bot.user_id))  # fmt: skip
                await owner.say(room_id, "and the last")
                await eventually(lambda: len(replies(owner, room_id, bot)) >= 4, timeout=60,
                                 what=lambda: owner.received(room_id, bot.user_id))  # fmt: skip
            finally:
                for daemon in daemons:
                    if daemon.proc is not None:
                        await daemon.stop()
            assert owner.received(room_id, bot.user_id) == [HINT] * 4


async def test_a_published_device_without_its_key_store_fails_the_start_as_doctor_says_it(
    synapse: Synapse, tmp_path: Path
) -> None:
    """The state dir's matrix/ key store lost (moved without it, a backup not restored)
    while the homeserver has the device's keys: a new store would be a new identity that
    people's clients refuse to encrypt for. `run` exits 2 with doctor's words, instead of
    starting without a word and reading nothing encrypted."""
    state, config = tmp_path / "state", tmp_path / "config.toml"
    async with people(synapse, tmp_path) as (bot, owner, room_id):
        config.write_text(config_text(synapse, bot, owner))
        env = echo_bot_env(MATRIX_ACCESS_TOKEN=bot.access_token)
        daemon = Daemon(config, state, env)
        await daemon.start()
        try:
            await bot_ready(owner, room_id, bot)  # its keys are published now
        finally:
            await daemon.stop()
        for key_store in (state / "matrix").glob("*.db"):
            key_store.unlink()
        args = ("--config", str(config), "--state-dir", str(state))
        done = await asyncio.to_thread(run_echo_bot, "run", *args, env=env, timeout=60)
        doctor = await asyncio.to_thread(run_echo_bot, "doctor", *args, env=env, timeout=60)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("echo-bot: ")]
    assert len(errors) == 1, done.stderr
    assert "holds no key store for it" in errors[0] and "restore" in errors[0], errors[0]
    assert "Traceback" not in done.stderr
    (keys,) = [line for line in doctor.stdout.splitlines() if "] matrix keys " in line]
    assert keys.startswith("[FAIL]") and "holds no key store for it" in keys
    assert not list((state / "matrix").glob("*.db")), "a new identity was made"
