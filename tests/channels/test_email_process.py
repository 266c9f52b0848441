"""The e-mail channel in real `echo-bot run` processes against the real servers of
tests/mail_server.py: two daemons on one PostgreSQL store read one mailbox one at a
time; the reader killed, the other takes over within the lease, and every mail is
answered once."""

from __future__ import annotations

import asyncio
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path

from echo_bot.brains.rules import NO_MATCH_HINT
from tests.channels.contract.drivers import mail_text
from tests.channels.test_matrix_process import all_sent
from tests.conftest import echo_bot_env
from tests.mail_server import MailServers
from tests.proc import Daemon
from tests.waiting import eventually


def config_text(servers: MailServers, bot: str, owner: str, name: str) -> str:
    storage = f'[bot]\ninstance = "{name}"\n[storage]\nengine = "postgres"\n'
    return storage + servers.section(bot, [owner])


async def test_two_daemons_on_one_store_read_one_at_a_time_and_take_over(
    mail_servers: MailServers, tmp_path: Path
) -> None:
    from tests.postgres import fresh_database

    bot, password = mail_servers.add_user("bot")
    owner, _ = mail_servers.add_user("owner")

    async def say(text: str) -> None:
        mail = EmailMessage()
        mail["From"], mail["To"], mail["Subject"] = owner, bot, text
        mail["Message-ID"] = make_msgid(domain="example.org")
        mail.set_content(f"zz {text}")
        await asyncio.to_thread(mail_servers.send, mail, login=owner)

    def answers() -> list[str]:
        return [mail_text(m) for m in mail_servers.inbox(owner)]

    with fresh_database() as url:
        daemons = []
        for name in ("a", "b"):
            config = tmp_path / f"{name}.toml"
            config.write_text(config_text(mail_servers, bot, owner, name))
            env = echo_bot_env(ECHO_BOT_EMAIL_PASSWORD=password, ECHO_BOT_DATABASE_URL=url)
            daemons.append(Daemon(config, tmp_path / f"state-{name}", env))
        first, second = daemons
        try:
            await first.start()
            await eventually(lambda: first.said("email: reading now"), timeout=30,
                             what=lambda: "\n".join(first.lines))  # fmt: skip
            await second.start()
            await eventually(lambda: second.said("another daemon reads"), timeout=30,
                             what=lambda: "\n".join(second.lines))  # fmt: skip
            await say("one")
            await eventually(lambda: len(answers()) == 1, timeout=60, what="the first answer")
            # Killed once that answer is stored as sent: one in flight at a kill is sent
            # again by the daemon that takes over (delivery is at-least-once at a kill),
            # with the same Message-ID.
            await eventually(lambda: all_sent(url, tmp_path), timeout=30,
                             what="the first answer stored as sent")  # fmt: skip
            await first.kill()
            await say("two")
            await say("three")
            await eventually(lambda: second.said("email: reading now"), timeout=30,
                             what=lambda: "\n".join(second.lines))  # fmt: skip
            await eventually(lambda: len(answers()) >= 3, timeout=60,
                             what=lambda: "\n".join(second.lines[-30:]))  # fmt: skip
            await say("four")
            await eventually(lambda: len(answers()) >= 4, timeout=60, what=answers)
            await asyncio.sleep(2)  # a repeat would show by now
        finally:
            for daemon in daemons:
                if daemon.proc is not None:
                    await daemon.stop()
    assert answers() == [NO_MATCH_HINT] * 4
