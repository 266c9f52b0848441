"""Files in and out of messages: what a message carries (read when it arrives) and the
download of one of its files (during its turn, when the core asks)."""

from __future__ import annotations

from pathlib import Path

from aiogram import Bot
from aiogram.exceptions import TelegramBadRequest
from aiogram.types import Message

from echo_bot.downloads import DownloadLimit, fetch_to, save_whole
from echo_bot.errors import MediaUnavailable
from echo_bot.events import Attachment, MediaKind

from .settings import TelegramConfig
from .text import clean


def read_media(message: Message, config: TelegramConfig) -> tuple[list[Attachment], list[str]]:
    """A message's files (fetched later, during its turn) and short notes for what is
    not a file: stickers, locations, contacts, polls. Nothing is silently dropped."""
    found: list[Attachment] = []
    if message.photo:
        # The largest size that fits the download limit (or else the smallest: its
        # fetch then says why it cannot be had).
        sizes = sorted(message.photo, key=lambda p: p.width * p.height)
        fitting = [p for p in sizes if (p.file_size or 0) <= config.max_download]
        best = (fitting or sizes[:1])[-1]
        found.append(_attachment(MediaKind.PHOTO, best.file_id, size=best.file_size))
    for kind, item in (
        (MediaKind.VOICE, message.voice),
        (MediaKind.AUDIO, message.audio),
        (MediaKind.VIDEO, message.video),
        (MediaKind.VIDEO_NOTE, message.video_note),
        (MediaKind.ANIMATION, message.animation),
        (MediaKind.DOCUMENT, None if message.animation else message.document),
    ):
        if item is not None:
            found.append(
                _attachment(
                    kind,
                    item.file_id,
                    name=getattr(item, "file_name", None),
                    mime_type=getattr(item, "mime_type", None),
                    size=item.file_size,
                    duration=getattr(item, "duration", None),
                )
            )
    notes = _notes(message)
    if found and not config.media:
        notes += [f"[{a.kind.value.replace('_', ' ')} not downloaded: [telegram] media is off]"
                  for a in found]  # fmt: skip
        found = []
    return found, notes


def _attachment(
    kind: MediaKind,
    file_id: str,
    *,
    name: str | None = None,
    mime_type: str | None = None,
    size: int | None = None,
    duration: int | None = None,
) -> Attachment:
    return Attachment(
        kind=kind,
        file_ref=file_id[:512],
        name=clean(name)[:256] if name else None,
        mime_type=clean(mime_type)[:128] if mime_type else None,
        size=size if size is None or size >= 0 else None,
        duration=duration if duration is None or duration >= 0 else None,
    )


def _notes(message: Message) -> list[str]:
    notes: list[str] = []
    if message.sticker is not None:
        sticker = message.sticker
        label = f" {sticker.emoji}" if sticker.emoji else ""
        notes.append(
            f"[sticker{label}" + (f" from the set {sticker.set_name}]" if sticker.set_name else "]")
        )
    if message.venue is not None:
        venue = message.venue
        notes.append(
            f"[venue: {venue.title}, {venue.address} "
            f"({venue.location.latitude:.5f}, {venue.location.longitude:.5f})]"
        )
    elif message.location is not None:
        where = message.location
        live = " (live)" if where.live_period else ""
        notes.append(f"[location{live}: {where.latitude:.5f}, {where.longitude:.5f}]")
    if message.contact is not None:
        contact = message.contact
        name = " ".join(p for p in (contact.first_name, contact.last_name) if p)
        notes.append(f"[contact: {name}, {contact.phone_number}]")
    if message.poll is not None:
        poll = message.poll
        options = " / ".join(o.text for o in poll.options)
        notes.append(f"[poll: {poll.question} — {options}]")
    if message.dice is not None:
        notes.append(f"[dice {message.dice.emoji}: {message.dice.value}]")
    return [clean(note)[:2000] for note in notes]


class Downloads:
    """Fetches a message's files from the Bot API, within ``[telegram] max_download``."""

    def __init__(self, bot: Bot, config: TelegramConfig) -> None:
        self.bot = bot
        self.config = config

    async def fetch_media(
        self, attachment: Attachment, destination: Path, *, limit: int | None = None
    ) -> int:
        """Download a message's file (the core calls this during the turn) to
        ``destination``, through a temporary name: there is a whole file or none.
        ``limit`` (what the core's media budgets leave) stops it sooner than
        ``max_download`` when it is smaller."""
        too_big = DownloadLimit(self.config.max_download, limit, "[telegram] max_download")
        cap = too_big.cap
        if attachment.size is not None and attachment.size > cap:
            raise too_big(attachment.size)
        try:
            file = await self.bot.get_file(attachment.file_ref)
        except TelegramBadRequest as exc:  # "file is too big", "wrong file_id"…
            raise MediaUnavailable(f"Telegram would not hand it over ({exc.message})") from None
        if file.file_size is not None and file.file_size > cap:
            raise too_big(file.file_size)
        if not file.file_path:
            raise MediaUnavailable("Telegram gave no path to download it from")
        url = self.bot.session.api.file_url(self.bot.token, file.file_path)
        return await save_whole(  # the URL holds the token: no error quotes it
            destination, lambda partial: fetch_to(partial, url, too_big, peer="Telegram")
        )
