"""What a text becomes on its way to and from Telegram: messages with entities (through
the core's ``echo_bot.richtext`` pipeline), a preview's part, and clean Unicode from an
update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiogram.types import MessageEntity

from echo_bot.bus import Masking
from echo_bot.richtext import parts
from echo_bot.richtext.model import Formatted, Span, utf16_offsets
from echo_bot.richtext.splitting import Unit

from .render import MAX_TEXT


@dataclass(frozen=True)
class TelegramText:
    """Telegram's wire: the visible text itself plus entities, counted in UTF-16 units."""

    limit: int = MAX_TEXT
    unit: Unit = "utf16"

    def wire(self, part: Formatted) -> Formatted:
        return part

    def visible(self, wire: Formatted) -> str:
        return wire.text

    def fits(self, wire: Formatted) -> bool:
        return True


TEXT = TelegramText()


def message_parts(
    text: str, markdown: bool, masker: Masking | None = None, *, limit: int = MAX_TEXT
) -> list[Formatted]:
    """The messages a text is sent as: Markdown rendered to entities, masked, split
    within ``limit``."""
    return parts.message_parts(text, markdown, masker, TelegramText(limit))


async def rendered(text: str, markdown: bool, masker: Masking | None) -> list[Formatted]:
    return await parts.rendered_parts(text, markdown, masker, TEXT)


def preview_part(text: str, mark: str = "", masker: Masking | None = None) -> Formatted | None:
    return parts.preview_part(text, masker, TEXT, mark)


async def rendered_preview(text: str, mark: str, masker: Masking | None) -> Formatted | None:
    return await parts.rendered_preview(text, masker, TEXT, mark)


def entity(span: Span, units: list[int]) -> dict[str, Any]:
    """``span`` as a Bot API MessageEntity; ``units[i]``: UTF-16 offset of code point i."""
    found: dict[str, Any] = {
        "type": span.type,
        "offset": units[span.start],
        "length": units[span.end] - units[span.start],
    }
    if span.url is not None:
        found["url"] = span.url
    if span.language:
        found["language"] = span.language
    return found


def entity_dicts(part: Formatted) -> list[dict[str, Any]]:
    units = utf16_offsets(part.text)
    return [entity(span, units) for span in part.spans]


def entities(part: Formatted) -> list[MessageEntity]:
    return [MessageEntity(**found) for found in entity_dicts(part)]


def clean(text: str) -> str:
    """Valid Unicode only. JSON may carry a lone surrogate ("\\ud800"), which no store
    can encode: such an update would fail to commit on every try and stall the queue."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
