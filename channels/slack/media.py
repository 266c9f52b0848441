"""Files people share, both ways: a ``file_share`` message's files read into
``Attachment``s (the file's private download URL is committed with the message and the
file fetched during the turn), and ``fetch_media`` streaming one within ``[slack]
max_download`` through a ``.part`` name.

The download needs the bot token (``files:read``): it is sent only to Slack's file
host or the configured ``api_base``'s (a test server, a proxy), never to a URL
elsewhere, and redirects are not followed (Slack answers a request without a valid
token with its sign-in page, which is refused here as HTML, not saved as the file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from channels.parts import clean
from echo_bot.downloads import DownloadLimit, fetch_to, save_whole
from echo_bot.errors import MediaUnavailable
from echo_bot.events import Attachment, MediaKind

from .settings import SlackConfig

FILES_MAX = 10  # an inbound carries at most 10 attachments
SLACK_FILES = "files.slack.com"


def kind_of(mime: str) -> MediaKind:
    if mime.startswith("image/"):
        return MediaKind.PHOTO
    if mime.startswith("audio/"):
        return MediaKind.AUDIO
    if mime.startswith("video/"):
        return MediaKind.VIDEO
    return MediaKind.DOCUMENT


def _size(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_files(event: dict[str, Any], config: SlackConfig) -> tuple[list[Attachment], list[str]]:
    """The files of a message, and notes for those not taken (and why)."""
    given = event.get("files")
    files = [f for f in given if isinstance(f, dict)] if isinstance(given, list) else []
    attachments: list[Attachment] = []
    notes: list[str] = []
    for item in files:
        name = clean(str(item.get("name") or item.get("title") or "a file"))[:200]
        if not config.media:
            notes.append(f"[a file, {name}: not downloaded, [slack] media is off]")
            continue
        url = item.get("url_private_download") or item.get("url_private")
        if not isinstance(url, str) or len(url) > 512 or not allowed_host(url, config):
            notes.append(f"[a file, {name}: Slack gave no download address I may use]")
            continue
        if len(attachments) >= FILES_MAX:
            notes.append(f"[a file, {name}: more than {FILES_MAX} files in one message]")
            continue
        mime = clean(str(item.get("mimetype") or ""))[:128]
        attachments.append(
            Attachment(
                kind=kind_of(mime), file_ref=url, name=name, mime_type=mime or None,
                size=_size(item.get("size")),
            )
        )  # fmt: skip
    return attachments, notes


def allowed_host(url: str, config: SlackConfig) -> bool:
    """Whether the bot token may go to ``url``: Slack's file host, or ``api_base``'s."""
    parts, base = urlsplit(url), urlsplit(config.api_base)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return False
    if parts.scheme == "https" and parts.hostname == SLACK_FILES:
        return True
    return (parts.scheme, parts.hostname, parts.port) == (base.scheme, base.hostname, base.port)


class Downloads:
    def __init__(self, config: SlackConfig, token: str) -> None:
        self.config = config
        self.token = token

    async def fetch_media(
        self, attachment: Attachment, destination: Path, *, limit: int | None = None
    ) -> int:
        too_big = DownloadLimit(self.config.max_download, limit, "[slack] max_download")
        if attachment.size is not None and attachment.size > too_big.cap:
            raise too_big(attachment.size)
        if not allowed_host(attachment.file_ref, self.config):
            raise MediaUnavailable("its address is not Slack's")
        url = attachment.file_ref
        return await save_whole(destination, lambda partial: self._download(url, partial, too_big))

    async def _download(self, url: str, partial: Path, too_big: DownloadLimit) -> int:
        return await fetch_to(
            partial, url, too_big, peer="Slack", headers={"Authorization": f"Bearer {self.token}"},
            html_means="Slack answered with a page, not the file (does the bot token have"
            " files:read?)",
        )  # fmt: skip
