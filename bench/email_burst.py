"""E-mail bursts: many mails in, each answered, against a provider's sending limit.

In one process: Dovecot and the receiving SMTP server of ``tests/mail_server.py`` (real
servers on 127.0.0.1), the SMTP server answering the bot's mails past ``--rate`` a
second (after a burst of 5) with 451 "try again later", as a provider's limit does; the
real core with the e-mail channel (SQLite in a temp dir, the offline rules brain,
``[email] max_per_minute`` set to the same limit). People send every mail at once,
each a thread of its own; every mail is answered in its thread.

Cases: one person's burst; the same number spread over several people. Prints per
case: mails, the time until all were answered, the inbounds the store took (lost: sent
but never stored), the replies seen (duplicates: more than one to a mail), the 451s and
their share of the bot's submissions, failed replies.

    python bench/email_burst.py            # 60 from one person, 120 from 10 (about 40 s)
    python bench/email_burst.py --quick    # 8 from one, 20 from 4 (seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from email.message import EmailMessage
from email.utils import make_msgid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.burst_table import report, stored  # noqa: E402
from tests.conftest import running_bot  # noqa: E402
from tests.mail_server import MailServers, start_mail_servers  # noqa: E402

BURST = 5


def send_all(servers: MailServers, mails: list[tuple[str, EmailMessage]]) -> None:
    for sender, mail in mails:
        servers.send(mail, login=sender)


async def burst(
    work: Path, servers: MailServers, name: str, messages: int, people: int, rate: float
) -> dict[str, object]:
    bot_address, password = servers.add_user("bot")
    users = [servers.add_user(f"person{i}")[0] for i in range(people)]
    servers.limit_sends(bot_address, rate, BURST)
    servers.refused = 0
    config = servers.section(bot_address, users, extra=f"max_per_minute = {int(rate * 60)}")
    env = {"ECHO_BOT_EMAIL_PASSWORD": password}
    mails = []
    for index in range(messages):
        sender = users[index % people]
        mail = EmailMessage()
        mail["From"], mail["To"], mail["Subject"] = sender, bot_address, f"zz {index}"
        mail["Message-ID"] = make_msgid(domain="example.org")
        mail.set_content(f"zz message {index}")
        mails.append((sender, mail))
    wanted = {str(m["Message-ID"]) for _, m in mails}
    async with running_bot(work / name, config, environ=env, channels=["email"]) as bot:

        def replies() -> list[str]:
            return [str(m["In-Reply-To"]) for u in users for m in servers.inbox(u)
                    if str(m["In-Reply-To"]) in wanted]  # fmt: skip

        started = time.monotonic()
        await asyncio.to_thread(send_all, servers, mails)
        sent_in = time.monotonic() - started
        deadline = time.monotonic() + 60 + 2 * messages / rate
        while time.monotonic() < deadline:
            if len(await asyncio.to_thread(replies)) >= messages:
                break
            await asyncio.sleep(0.5)
        took = time.monotonic() - started
        await asyncio.sleep(2.0)  # a duplicate would show by now

        rows, failed = await stored(bot.store, "email", messages)
        seen = await asyncio.to_thread(replies)
    servers.limited = None
    return {
        "case": name, "messages": messages, "sent_in": sent_in, "answered_in": took,
        "stored": rows, "lost": messages - rows, "answers": len(set(seen)),
        "duplicates": len(seen) - len(set(seen)), "refused": servers.refused,
        "sends": len(seen) + servers.refused, "failed": failed,
    }  # fmt: skip


async def amain(args: argparse.Namespace) -> int:
    one, spread, spread_people = (8, 20, 4) if args.quick else (60, 120, 10)
    with tempfile.TemporaryDirectory(prefix="echo-bot-email-burst-") as tmp, \
            start_mail_servers() as servers:  # fmt: skip
        work = Path(tmp)
        outcomes = [
            await burst(work, servers, "one person", one, 1, args.rate),
            await burst(work, servers, f"{spread_people} people", spread, spread_people,
                        args.rate),
        ]  # fmt: skip
    limit = f"[email] max_per_minute = {int(args.rate * 60)}"
    print(f"SMTP server: the bot's mails past {args.rate:g}/s (after {BURST} at once) answered"
          f" 451; {limit}; IDLE; rules brain.\n")  # fmt: skip
    held = report(outcomes, quick=args.quick, messages="mails", rate="replies/s",
                  sends="submissions", refusals="451s")  # fmt: skip
    return 0 if held else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small bursts (seconds)")
    parser.add_argument("--rate", type=float, default=2.0, help="the limit, mails a second")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(amain(args))
    return 130


if __name__ == "__main__":
    raise SystemExit(main())
