"""A file someone mailed, fetched during the turn: the mail read again from the mailbox
(its UIDVALIDITY checked: a renumbered mailbox no longer names it) and the part taken
out, within ``[email] max_download``."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from echo_bot.downloads import DownloadLimit, save_whole
from echo_bot.errors import ChannelError, ConfigError, MediaUnavailable
from echo_bot.events import Attachment

from .mailbox import Mailbox, MailboxAway
from .reading import parsed
from .settings import EmailConfig


class Downloads:
    def __init__(self, config: EmailConfig, password: str) -> None:
        self.config = config
        self._password = password

    async def fetch_media(
        self, attachment: Attachment, destination: Path, *, limit: int | None = None
    ) -> int:
        too_big = DownloadLimit(self.config.max_download, limit, "[email] max_download")
        if attachment.size is not None and attachment.size > too_big.cap:
            raise too_big(attachment.size)
        try:
            validity, uid, index = (int(n) for n in attachment.file_ref.split(":"))
        except ValueError:
            raise MediaUnavailable("not a file of this mailbox") from None
        raw = await self._mail(validity, uid)
        data = await asyncio.to_thread(_part, raw, index)
        if not isinstance(data, bytes):
            raise MediaUnavailable("the mail holds no such file")
        if len(data) > too_big.cap:
            raise too_big(len(data))

        async def write(partial: Path) -> int:
            return await asyncio.to_thread(partial.write_bytes, data)

        return await save_whole(destination, write)

    async def _mail(self, validity: int, uid: int) -> bytes:
        box = Mailbox(self.config, self._password)
        try:
            selected = await box.open()
            if selected.validity != validity:
                raise MediaUnavailable("the mailbox was renumbered since the mail came")
            raw = await box.whole(uid)
        except MailboxAway as exc:
            raise ChannelError(f"email: {exc}") from None
        except ConfigError as exc:
            raise ChannelError(f"email: {exc}", retryable=False) from None
        finally:
            await box.close()
        if raw is None:
            raise MediaUnavailable("the mail is no longer in the mailbox")
        return raw


def _part(raw: bytes, index: int) -> bytes | None:
    """The decoded content of the mail's part ``index`` (``walk()`` order)."""
    parts = list(itertools.islice(parsed(raw).walk(), index + 1))
    data = parts[index].get_payload(decode=True) if index < len(parts) else None
    return data if isinstance(data, bytes) else None
