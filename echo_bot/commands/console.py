"""/console: an approver asks for a one-time sign-in link to the web console.

The link is a bearer secret: whoever holds it signs in as the approver. So it is given
only in the asker's own chat with the bot (the terminal, a private chat — never a
group, whose other members would read it), and it never enters what is kept of the
conversation: the reply's text, which goes to the history the model reads and to the
audit log, only says that a link follows; the link itself is an attachment, an
outbound message to the same chat that only the outbox holds until it is delivered.
"""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Awaitable, Callable

from ..config import Config, console_base
from ..console.auth import ConsoleUser, link_url, new_link
from ..conversation import BrainContext, BrainReply
from ..dates import clock_text
from ..events import Address, OutboundKind, OutboundMessage
from ..live import Live
from ..plugins import is_local, is_machine
from ..store import Store
from .registry import Command, CommandContext, CommandRegistry

TimezoneFor = Callable[[Address], Awaitable[str]]

# The scheduler's origin: a job, not a person (a channel says so in its spec).
SCHEDULED = "cron"

HELP = "a one-time sign-in link to the web console (approvers, in a private chat)"
OFF = "The console is off: the owner switches it on with [console] enabled = true."
NOT_HERE = "Console links are given only in a chat with a person, not to a program or job."
NOT_APPROVER = "Only approvers sign in to the console."
NOT_PRIVATE = (
    "Ask for a console link in your private chat with me: the link signs in whoever "
    "reads it, so it is never sent to a group."
)


def owner_at_server() -> ConsoleUser:
    """The owner, named by the login name of the process (as ``echo-bot approvals``
    names the one who decides at the server)."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (a bare container)
        name = f"uid {os.getuid()}"
    return ConsoleUser(channel="echo-bot", id=name, name=name)


def refusal(started: Config, live: Live, context: BrainContext) -> str | None:
    """Why no link is given to this sender in this chat; None when one may be. The
    approvers are the live ones (a reload changes them); whether the console is on is
    what the daemon started with (a change to [console] needs a restart)."""
    origin, sender = context.origin, context.sender
    directory = live.current.directory
    if origin.channel == SCHEDULED or is_machine(origin.channel):
        return NOT_HERE
    if not directory.approves(origin, sender.id):
        return NOT_APPROVER
    if not directory.direct(origin, sender.id, context.direct):
        return NOT_PRIVATE
    if not started.console.enabled:
        return OFF
    return None


def user_of(context: BrainContext) -> ConsoleUser:
    """Who the link signs in: the owner in the terminal, else the approver who asked."""
    if is_local(context.origin.channel):
        return owner_at_server()
    sender = context.sender
    return ConsoleUser(channel=context.origin.channel, id=sender.id, name=sender.name or sender.id)


def register_console_command(
    commands: CommandRegistry,
    store: Store,
    live: Live,
    started: Config,
    timezone_for: TimezoneFor | None = None,
    clock: Callable[[], float] = time.time,
) -> None:
    """``started``: the config the daemon started with, whose [console] and [http] are
    the console it serves (a reload does not change them); ``live``: the approvers."""

    async def console(rest: str, ctx: CommandContext) -> BrainReply:
        context = ctx.brain
        refused = refusal(started, live, context)
        if refused is not None:
            return BrainReply(text=refused, route_reason="rules: command /console, refused")
        config = started
        user = user_of(context)
        ttl = config.console.link_ttl.total_seconds()
        now = clock()
        secret = await store.run(lambda tx: new_link(tx, user, ttl, now))
        zone = await timezone_for(context.origin) if timezone_for is not None else None
        until = clock_text(now + ttl, zone)
        link = OutboundMessage(
            to=context.origin,
            text=(
                f"Your sign-in link for the console (works once, until {until}; do not "
                f"forward it: it signs in whoever opens it):\n"
                f"{link_url(console_base(config), secret)}"
            ),
            kind=OutboundKind.NOTICE,
            trace_id=context.trace_id,
        )
        return BrainReply(  # one message in the chat: the link (kept out of the history)
            text=f"(A one-time sign-in link for the console was sent, until {until}.)",
            attachments=[link],
            shown=False,
        )

    commands.register(Command("console", HELP, console))
