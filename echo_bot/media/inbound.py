"""The files a message carries, made ready for its turn: fetched, saved, transcribed.

A message's attachments are committed by reference (``Attachment.file_ref``); this runs
when its turn begins, before the user's message enters the history. It is repeatable:
after a crash the turn begins again and fetches what is not saved yet (a saved file is
complete: the channel writes it under a temporary name first). What cannot be fetched
becomes a note on the message (``conversation.FileNote``), never a failed turn.

Files go to ``<workspace>/inbox/<sender>/<UTC date>/<id>-<n>-<name>`` (``media/inbox.py``
says why the sender comes first): the path follows from the message alone, so a resumed
turn finds what an earlier try saved. Before a file is fetched the media budgets
(``media/budget.py``) say whether it fits and how many bytes it may have; a file refused
is a note on the message and a notice to its sender.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path, PurePosixPath

from ..bus import MediaSource
from ..conversation import FileNote
from ..errors import EchoBotError, MediaTooLarge, MediaUnavailable
from ..events import Attachment, MediaKind, MessageInbound, utcnow
from ..sizes import format_size
from .budget import MediaBudget, OverBudget
from .inbox import INBOX, sender_folder

log = logging.getLogger(__name__)

FETCH_ATTEMPTS = 3
FETCH_BACKOFF = (1.0, 3.0)  # seconds before the 2nd and 3rd try
FETCH_TIMEOUT = 120.0  # one try, whole file
SOURCE_WAIT = 30.0  # at start-up a recovered turn may begin before its channel is up
QUOTE_CHARS = 300  # of a transcript, shown back to the sender
MAX_TRANSCRIPT = 20_000  # characters of a transcript kept as the message

_NAMES = {
    MediaKind.PHOTO: ("photo", ".jpg"),
    MediaKind.VOICE: ("voice note", ".ogg"),
    MediaKind.AUDIO: ("audio", ".mp3"),
    MediaKind.VIDEO: ("video", ".mp4"),
    MediaKind.VIDEO_NOTE: ("video note", ".mp4"),
    MediaKind.ANIMATION: ("animation", ".mp4"),
    MediaKind.DOCUMENT: ("document", ""),
}
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
TRANSCRIPTION_HINT = (
    "I saved your {what} but cannot listen to it: set [openai] transcription_model in the "
    'config (for example "whisper-1", or a local Whisper server\'s model) to have voice '
    "notes transcribed."
)


class TranscriptionFailed(EchoBotError):
    """The transcription endpoint gave no transcript this time."""


Transcribe = Callable[[Path, str], Awaitable[str]]
# Whether a message's sender is exempt from the daily budget per sender (an approver).
Exempt = Callable[[MessageInbound], Awaitable[bool]]


@dataclass(frozen=True, slots=True)
class Saved:
    attachment: Attachment
    path: Path  # absolute
    relative: str  # as the workspace's tools name it
    size: int


@dataclass(slots=True)
class PreparedMessage:
    """What the turn starts from: the user's words (a transcript first) and a note on
    each of its files, as the brain reads them; the images a model that sees may be
    shown, and notices for the sender (sent first)."""

    text: str
    files: list[FileNote] = field(default_factory=list)
    images: list[Saved] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


def safe_name(attachment: Attachment, index: int) -> str:
    label, suffix = _NAMES[attachment.kind]
    given = PurePosixPath((attachment.name or "").replace("\\", "/")).name
    cleaned = _SAFE.sub("_", given).strip("._")[:80]
    if not cleaned:
        cleaned = label.replace(" ", "_") + suffix
    return f"{index + 1}-{cleaned}"


def saved_path(message: MessageInbound, index: int) -> PurePosixPath:
    """Where attachment ``index`` of ``message`` is saved, relative to the workspace."""
    day = message.received_at.strftime("%Y-%m-%d")
    name = f"{message.id[-8:]}-{safe_name(message.attachments[index], index)}"
    folder = sender_folder(message.address.channel, message.sender.id)
    return PurePosixPath(INBOX, folder, day, name)


class MediaPreparer:
    def __init__(
        self,
        workspace: Path,
        *,
        transcribe: Transcribe | None = None,
        budget: MediaBudget | None = None,
        exempt: Exempt | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.workspace = workspace
        self.transcribe = transcribe
        self.budget = budget
        self.exempt = exempt
        self.sleep = sleep
        self._sources: dict[str, MediaSource] = {}
        self._arrived: dict[str, asyncio.Event] = {}

    def add_source(self, source: MediaSource) -> None:
        self._sources[source.name] = source
        self._arrival(source.name).set()

    def _arrival(self, name: str) -> asyncio.Event:
        return self._arrived.setdefault(name, asyncio.Event())

    def images_of(self, message: MessageInbound) -> list[Path]:
        """The photos of ``message`` that are saved (absolute paths)."""
        if not any(attachment.kind == MediaKind.PHOTO for attachment in message.attachments):
            return []  # most messages: no look at the file system (it blocks the loop)
        root = self.workspace.resolve()
        found = []
        for index, attachment in enumerate(message.attachments):
            if attachment.kind == MediaKind.PHOTO:
                path = root.joinpath(*saved_path(message, index).parts)
                if path.is_file() and not path.is_symlink():
                    found.append(path)
        return found

    async def prepare(self, message: MessageInbound) -> PreparedMessage:
        prepared = PreparedMessage(text=message.text or "")
        notes = prepared.files
        heard: list[str] = []
        exempt: list[bool] = []  # asked once, when a file is to be fetched
        for index, attachment in enumerate(message.attachments):
            what, _ = _NAMES[attachment.kind]
            announced = _announced(attachment)
            try:
                saved = await self._fetch(message, index, exempt)
            except OverBudget as exc:
                notes.append(FileNote(what, None, f"{announced}{exc}"))
                notice = exc.refusal.notice(what, utcnow())
                if notice not in prepared.notices:
                    prepared.notices.append(notice)
                continue
            except MediaUnavailable as exc:
                notes.append(FileNote(what, None, f"{announced}{exc}"))
                continue
            except OSError as exc:  # the workspace cannot take it (full disk, permissions)
                log.warning("media: %s of %s could not be saved: %s", what, message.id, exc)
                notes.append(
                    FileNote(what, None, f"{announced}it could not be saved ({exc.strerror})")
                )
                continue
            except Exception as exc:  # a file is never worth a failed turn
                log.exception("media: %s of %s could not be fetched", what, message.id)
                notes.append(FileNote(what, None, f"{announced}it failed ({type(exc).__name__})"))
                continue
            if attachment.kind in (MediaKind.VOICE, MediaKind.AUDIO):
                notes.append(await self._listen(saved, prepared, heard))
                continue
            if attachment.kind == MediaKind.PHOTO:
                prepared.images.append(saved)
            notes.append(FileNote(what, saved.relative, _facts(saved)))
        if heard:
            prepared.text = "\n".join(part for part in [*heard, prepared.text] if part)
        return prepared

    async def _listen(self, saved: Saved, prepared: PreparedMessage, heard: list[str]) -> FileNote:
        what, _ = _NAMES[saved.attachment.kind]
        facts = _facts(saved)

        def note(outcome: str) -> FileNote:
            return FileNote(what, saved.relative, f"{facts}; {outcome}")

        if self.transcribe is None:
            prepared.notices.append(TRANSCRIPTION_HINT.format(what=what))
            return note("not transcribed")
        try:
            transcript = (await self.transcribe(saved.path, saved.path.name)).strip()
        except Exception as exc:  # a failed transcription never fails the turn
            if not isinstance(exc, TranscriptionFailed):
                log.exception("media: transcription of %s failed", saved.relative)
                exc = TranscriptionFailed(f"the transcription failed ({type(exc).__name__})")
            log.warning("media: transcription of %s failed: %s", saved.relative, exc)
            prepared.notices.append(f"I could not transcribe your {what}: {exc}")
            return note(f"transcription failed: {exc}")
        if not transcript:
            return note("no speech heard")
        transcript = transcript[:MAX_TRANSCRIPT]
        heard.append(transcript)
        shown = transcript if len(transcript) <= QUOTE_CHARS else transcript[:QUOTE_CHARS] + "…"
        prepared.notices.append(f"🎙 “{shown}”")
        return note("transcribed above")

    async def _fetch(self, message: MessageInbound, index: int, exempt: list[bool]) -> Saved:
        attachment = message.attachments[index]
        relative = saved_path(message, index)
        target = await asyncio.to_thread(self._place, relative)
        size = await asyncio.to_thread(_existing_size, target)
        if size is not None:  # saved by an earlier try of this turn
            return Saved(attachment, target, str(relative), size)
        source = await self._source(message.address.channel)
        if self.budget is None:
            return await self._download(source, attachment, target, relative, None)
        if not exempt:
            exempt.append(self.exempt is not None and await self.exempt(message))
        budget = self.budget
        folder, day = relative.parts[1], date.fromisoformat(relative.parts[2])
        admission = await budget.admit(folder, day, attachment.size, exempt=exempt[0])
        try:
            return await self._download(source, attachment, target, relative, admission.limit)
        except MediaTooLarge:  # its size was not announced (or not truly)
            raise OverBudget(admission.bound, None) from None
        finally:
            budget.release(admission)

    async def _download(
        self,
        source: MediaSource,
        attachment: Attachment,
        target: Path,
        relative: PurePosixPath,
        limit: int | None,
    ) -> Saved:
        failure = ""
        for attempt in range(FETCH_ATTEMPTS):
            if attempt:
                await self.sleep(FETCH_BACKOFF[min(attempt - 1, len(FETCH_BACKOFF) - 1)])
            try:
                async with asyncio.timeout(FETCH_TIMEOUT):
                    size = await source.fetch_media(attachment, target, limit=limit)
            except MediaUnavailable:
                raise
            except Exception as exc:  # network, server: worth another try
                failure = str(exc) or type(exc).__name__
                log.info("media: fetching %s failed (try %d): %s", relative, attempt + 1, failure)
                continue
            return Saved(attachment, target, str(relative), size)
        raise MediaUnavailable(f"it could not be fetched ({failure})")

    async def _source(self, channel: str) -> MediaSource:
        source = self._sources.get(channel)
        if source is None:
            try:
                async with asyncio.timeout(SOURCE_WAIT):
                    await self._arrival(channel).wait()
            except TimeoutError:
                raise MediaUnavailable(f"the {channel} channel is not running") from None
            source = self._sources[channel]
        return source

    def _place(self, relative: PurePosixPath) -> Path:
        """The absolute path for ``relative``, its directory made; refused if anything
        on the way (a symbolic link a tool left in the workspace) leads outside it."""
        root = self.workspace.resolve()
        root.mkdir(parents=True, exist_ok=True)
        folder = root
        for part in relative.parts[:-1]:  # one at a time: never through a symlink
            folder = folder / part
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise MediaUnavailable(f"{relative.parent} in the workspace is not a plain folder")
            folder.mkdir(exist_ok=True)
        return folder / relative.name


def _existing_size(path: Path) -> int | None:
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    return info.st_size if path.is_file() and not path.is_symlink() else None


def _facts(saved: Saved) -> str:
    facts = [format_size(saved.size)]
    attachment = saved.attachment
    if attachment.mime_type:
        facts.insert(0, attachment.mime_type)
    if attachment.duration:
        facts.append(f"{attachment.duration} s")
    if attachment.kind == MediaKind.DOCUMENT and attachment.name:
        facts.insert(0, f"named {attachment.name!r}")
    return ", ".join(facts)


def _announced(attachment: Attachment) -> str:
    """A file that was not fetched, as its channel announced it, for the note that says
    so: "'big.iso' (application/x-iso9660-image, 25.0 MB) — ", so that the model (and
    the person) can tell which of a message's files it was; "" when nothing names it."""
    if not (attachment.name or attachment.mime_type):
        return ""
    facts = [f for f in (attachment.mime_type,) if f]
    if attachment.size is not None:
        facts.append(format_size(attachment.size))
    name = f"{attachment.name!r} " if attachment.name else ""
    return f"{name}({', '.join(facts)}) — " if facts else f"{name}— "
