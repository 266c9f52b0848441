"""Pigeon: updates read by long polling (``GET /updates?after=N``), each handed to the
edge and only then acknowledged (the position stored, the next poll past it); replies
sent through the outgoing-text pipeline (``POST /send``), prompts with buttons, edits
(``POST /edit``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from echo_bot.bus import Bus, Capabilities, ChannelHost
from echo_bot.errors import ChannelError, CommitFailed, PeerAway
from echo_bot.events import (
    Address,
    MessageInbound,
    OutboundMessage,
    Receipt,
    Sender,
    TextFormat,
)
from echo_bot.richtext import parts
from echo_bot.richtext.model import Formatted
from echo_bot.richtext.splitting import Unit

from . import PigeonConfig

POSITION = "pigeon-after"  # the last update handed to the edge, kept in the store
NETWORK = (aiohttp.ClientError, OSError, TimeoutError)


@dataclass(frozen=True)
class PigeonText:
    """Pigeon shows text as sent: no markup, 2,000 characters a message."""

    limit: int = 2_000
    unit: Unit = "chars"

    def wire(self, part: Formatted) -> str:
        return part.text

    def visible(self, wire: str) -> str:
        return wire

    def fits(self, wire: str) -> bool:
        return True


class PigeonChannel:
    name = "pigeon"
    capabilities = Capabilities(buttons=True, edits=True, connects=True)

    def __init__(self, section: PigeonConfig, options: Mapping[str, Any], host: ChannelHost):
        self.config = section
        self.host = host
        self.edge = host.edge("pigeon")
        self.token = host.environ.get(section.token_env, "")
        self.link = host.link("pigeon")  # its health; the host makes its first contact
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, bus: Bus) -> None:
        auth = {"Authorization": f"Bearer {self.token}"}
        self._session = aiohttp.ClientSession(headers=auth, timeout=aiohttp.ClientTimeout(10))

    async def connect(self) -> None:
        """The server answers (else ``PeerAway``: the host tries again), then polling."""
        try:
            await self._call("GET", "updates", after=0, wait=0)
        except ChannelError as exc:
            raise PeerAway(str(exc)) from None
        self._task = asyncio.create_task(self._poll())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._session is not None:
            await self._session.close()

    def health(self) -> dict[str, object]:
        return self.link.state()

    async def _poll(self) -> None:
        kept = await self.host.recall(POSITION)
        after = kept[0] if kept else 0
        while True:
            try:
                updates = await self._call(
                    "GET", "updates", after=after, wait=self.config.poll_wait
                )
                self.link.connected()
            except ChannelError as exc:
                self.link.reconnecting(str(exc))  # tried again, never a reason to stop
                await self.link.pause()
                continue
            for update in updates:
                try:
                    await self._take(update)
                    await self.host.remember(POSITION, int(update["id"]))
                except CommitFailed:
                    await asyncio.sleep(0.5)  # not acknowledged: read again
                    break
                after = int(update["id"])

    async def _take(self, update: dict[str, Any]) -> None:
        """A message to the edge; a press to the edge's check of the prompt pressed."""
        chat = Address(channel="pigeon", chat_id=str(update["chat"]))
        sender, said = Sender(id=str(update["user"])), str(update["id"])
        press = update.get("press")
        if press is None:
            text = str(update.get("text", ""))
            await self.edge.take(
                MessageInbound(
                    address=chat, sender=sender, text=text, external_id=said, message_id=said
                )
            )
            return
        message, action = str(press.get("message")), str(press.get("action", ""))
        await self.edge.decide(message, sender, said, action=action, at=chat)

    async def send(self, message: OutboundMessage) -> Receipt:
        chat = message.to.chat_id
        markdown = message.format == TextFormat.MARKDOWN
        texts = await parts.rendered_parts(message.text, markdown, self.host.masker, PigeonText())
        if message.edit_of is not None and message.edit_message_id:
            await self._call("POST", "edit", chat=chat, id=message.edit_message_id, text=texts[0])
            return Receipt(channel_message_id=message.edit_message_id)
        buttons = [[{"label": b.label, "action": b.action} for b in row] for row in message.buttons]
        sent = None
        for index, text in enumerate(texts):
            last = index == len(texts) - 1
            answer = await self._call("POST", "send", chat=chat, text=text,
                                      buttons=buttons if last else [])  # fmt: skip
            sent = str(answer["id"])
            if last and message.buttons:  # a prompt: only what it offers may be pressed
                await self.edge.keep_prompt(sent, message)
        return Receipt(channel_message_id=sent)

    async def _call(self, method: str, path: str, **fields: Any) -> Any:
        assert self._session is not None
        url = f"{self.config.api_base}/{path}"
        try:
            if method == "GET":
                request = self._session.get(url, params={k: str(v) for k, v in fields.items()})
            else:
                request = self._session.post(url, json=fields)
            async with request as answer:
                if answer.status >= 500:
                    raise ChannelError(f"pigeon: {path} answered {answer.status}")
                if answer.status != 200:
                    raise ChannelError(f"pigeon: {path} refused ({answer.status})", retryable=False)
                return await answer.json()
        except NETWORK as exc:
            raise ChannelError(f"pigeon: cannot reach {self.config.api_base}: {exc!r}") from None
