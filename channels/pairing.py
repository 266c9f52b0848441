"""Pairing as every chat channel offers it to a stranger: the refusal that says how to
get in (at most once per ``REFUSAL_INTERVAL`` per person: anyone can write), and the
answer to a code sent on that channel (``echo-bot pair`` makes one code for any of them).
"""

from __future__ import annotations

import time

from echo_bot.bus import AccessControl

REFUSAL_INTERVAL = 600.0  # seconds between two refusals to one stranger
REMEMBERED = 10_000  # strangers remembered, at most

ANSWERS = {
    "paired": "Paired. Welcome! Send {help} to see what I can do.",
    "already": "You are already allowed to talk to me.",
    "wrong": "That code is not valid (codes expire after 10 minutes).",
    "locked": "Too many wrong codes. Try again in an hour.",
}


def pair_answer(result: str, help_command: str) -> str:
    """What the stranger is told after sending a code (``AccessControl.pair``'s result)."""
    return ANSWERS.get(result, "Pairing failed.").format(help=help_command)


async def pair_attempt(
    access: AccessControl, channel: str, user_id: str, text: str, help_command: str
) -> str | None:
    """The answer to a stranger's ``pair CODE`` (the code tried on ``channel``); None
    when ``text`` is not one."""
    if not text.lower().startswith("pair "):
        return None
    code = text.split(maxsplit=1)[1].strip()
    return pair_answer(await access.pair(channel, user_id, code[:32]), help_command)


def refusal(network: str, user_id: str, send_as: str) -> str:
    """The answer to a stranger: their ID, and the two ways in."""
    return (
        f"Sorry, I only talk to people my owner has allowed. Your {network.capitalize()} user"
        f" ID is {user_id}: the owner can add it to [{network}] allowed_users, or give you a"
        f" code from `echo-bot pair` to send {send_as}."
    )


class Refusals:
    """When each stranger was last refused."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}

    def due(self, user_id: str) -> bool:
        """Whether to refuse ``user_id`` now (counted as refused when True)."""
        now = time.monotonic()
        last = self._at.get(user_id)
        if last is not None and now - last < REFUSAL_INTERVAL:
            return False
        if len(self._at) > REMEMBERED:
            self._at.clear()
        self._at[user_id] = now
        return True
