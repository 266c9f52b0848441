"""What a text becomes in a mail: a plain-text part (the text as a person reads it) and
an HTML part written from the core's rendering (``channels/html.py``), sent together
as ``multipart/alternative``. Masking, the misleading-link rule and splitting are the
pipeline's (``echo_bot.richtext.parts``), done on the text a person sees."""

from __future__ import annotations

from dataclasses import dataclass

from channels.html import shown_html, to_html
from echo_bot.richtext.model import Formatted
from echo_bot.richtext.splitting import Unit

MAX_TEXT = 100_000  # characters of one mail's text: more is sent as several mails


@dataclass(frozen=True)
class MailText:
    """A mail's two bodies: (plain, HTML)."""

    limit: int = MAX_TEXT
    unit: Unit = "chars"

    def wire(self, part: Formatted) -> tuple[str, str]:
        return part.text, to_html(part)

    def visible(self, wire: tuple[str, str]) -> str:
        return f"{wire[0]}\n{shown_html(wire[1])}"

    def fits(self, wire: tuple[str, str]) -> bool:
        return len(wire[0]) + len(wire[1]) <= 4 * MAX_TEXT


TEXT = MailText()
