"""The bus: how channels hand work to the core, and the durable queues behind it.

A leaf module (stdlib, pydantic models from ``events``). The bus declares the inbox and
outbox interfaces; ``echo_bot.store`` implements them. Publishing commits the inbound to
the inbox *before* it returns, so a channel may acknowledge its peer (Telegram offset,
HTTP 202) as soon as ``publish`` returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from .events import (
    Address,
    Attachment,
    InboundMessage,
    InboundStatus,
    OutboundMessage,
    Receipt,
)

S = TypeVar("S")  # a channel's config section


@dataclass(frozen=True, slots=True)
class Published:
    inbound_id: str
    duplicate: bool


class Inbox(Protocol):
    async def add(self, message: InboundMessage) -> Published:
        """Commit ``message``; a repeat of (channel, external_id) is a duplicate."""
        ...

    async def status_of(self, inbound_id: str) -> tuple[InboundStatus, str | None] | None:
        """The inbound's status and error, None when unknown."""
        ...

    async def describe(self, inbound_id: str) -> dict[str, object] | None:
        """Status, error, result summary and times of an inbound, None when unknown."""
        ...


class Outbox(Protocol):
    async def enqueue(self, message: OutboundMessage) -> None:
        """Commit ``message`` for delivery (per-chat FIFO, retried until delivered)."""
        ...


class Bus:
    """Publish inbound and queue outbound, each committed before the call returns; the
    store tells the dispatcher and the delivery worker after the commit."""

    def __init__(self, inbox: Inbox, outbox: Outbox) -> None:
        self._inbox = inbox
        self._outbox = outbox

    async def publish(self, message: InboundMessage) -> Published:
        return await self._inbox.add(message)

    async def status(self, inbound_id: str) -> tuple[InboundStatus, str | None] | None:
        return await self._inbox.status_of(inbound_id)

    async def describe(self, inbound_id: str) -> dict[str, object] | None:
        return await self._inbox.describe(inbound_id)

    async def at_rest(
        self, inbound_id: str, timeout: float, poll: float = 0.05
    ) -> tuple[InboundStatus, str | None] | None:
        """Wait (briefly) until the inbound is at rest: a final status, or waiting for
        an approval."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            state = await self.status(inbound_id)
            if state is not None and (
                state[0].terminal or state[0] == InboundStatus.WAITING_APPROVAL
            ):
                return state
            if loop.time() >= deadline:
                return state
            await asyncio.sleep(poll)

    async def send(self, message: OutboundMessage) -> None:
        await self._outbox.enqueue(message)


class AccessControl(Protocol):
    """Who may talk to a chat channel: configured users plus those added by pairing."""

    async def is_allowed(self, channel: str, user_id: str) -> bool: ...

    async def pair(self, channel: str, user_id: str, code: str) -> str:
        """ "paired", "already", "wrong" or "locked"."""
        ...


class Routes(Protocol):
    """The core's HTTP server, as channels see it."""

    def add_route(
        self, method: str, path: str, handler: Callable[[Any], Any], *, reads_body: bool = False
    ) -> None: ...

    async def read_body(self, request: Any, *, key: str, limit: int | None = None) -> Any:
        """The body (bytes), or the refusal to answer with: bounded per ``key``, timed."""
        ...

    def add_health(self, name: str, check: Callable[[], dict[str, Any]]) -> None: ...


class Masking(Protocol):
    """The masker of the configured secrets (``echo_bot.secrets.Masker``), as channels
    see it: a channel that turns the text it is given into other text (Telegram renders
    Markdown) masks what it made, right before it leaves."""

    def mask(self, text: str) -> str: ...

    def mask_growing(self, text: str) -> str:
        """Masked, and an end that could begin a secret held back (a text still written)."""
        ...

    def find(self, text: str) -> list[tuple[int, int]]:
        """(start, end) of each secret in ``text``, sorted and apart."""
        ...


@dataclass(frozen=True, slots=True)
class ChannelSetup(Generic[S]):
    """What ``app`` hands a channel at construction: its own config section (``S``, e.g.
    TelegramConfig; None for a channel without one) and hooks."""

    section: S
    # request_stop() ends the daemon; request_stop(code) also sets its exit status.
    request_stop: Callable[..., None]
    environ: Mapping[str, str]
    commands: Sequence[tuple[str, str]] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    access: AccessControl | None = None
    http: Routes | None = None
    # Records an event in the audit log (masked), e.g. a refused webhook delivery.
    audit: Callable[..., Awaitable[None]] | None = None
    # The prompts of the approvals still pending for an address, built anew (a terminal
    # shows them again after a restart: its screen is gone, a Telegram message is not).
    pending_prompts: Callable[[Address], Awaitable[list[OutboundMessage]]] | None = None
    # The time zone a chat reads times in (its /timezone, else [bot] timezone).
    timezone_for: Callable[[Address], Awaitable[str]] | None = None
    # When the daemon started: outbound made before it waited for a channel of an
    # earlier run (or one that was not running), e.g. a reply whose terminal had closed.
    started_at: float | None = None
    # detach() tells the delivery worker this channel takes nothing more in this run (a
    # terminal whose output closed): its messages wait in the outbox, none is failed.
    detach: Callable[[], None] | None = None
    # hold(name, within): whether this daemon may do now the work only one daemon may do
    # at a time (polling a Telegram bot), with several daemons on one store; a holder
    # unseen ``within`` seconds counts as gone. It asks again every few seconds. None:
    # one daemon, always.
    hold: Callable[[str, float], Awaitable[bool]] | None = None
    # recall(name) / remember(name, value): a reader's position kept in the store (the
    # Telegram poller's offset), with when it was stored, so that the next poller —
    # after a restart, or another daemon's — goes on from it.
    recall: Callable[[str], Awaitable[tuple[int, float] | None]] | None = None
    remember: Callable[[str, int], Awaitable[None]] | None = None
    # stop_generation(key): the person asked to stop the reply being written for ``key``
    # (a preview's key); False when none is being written any more.
    stop_generation: Callable[[str], bool] | None = None
    # argv_args(tool): the arguments of ``tool`` that become a command line (a webhook
    # value must never begin one of their elements with '-'). None: nobody can say.
    argv_args: Callable[[str], Collection[str]] | None = None
    # The configured secrets: what a channel made of a (masked) text is masked again.
    masker: Masking | None = None


@runtime_checkable
class Channel(Protocol):
    """A channel adapter. New channel = a module in ``channels/`` + one registry line."""

    name: str

    def __init__(self, setup: ChannelSetup[Any]) -> None: ...

    async def start(self, bus: Bus) -> None: ...

    async def send(self, message: OutboundMessage) -> Receipt: ...

    async def stop(self) -> None: ...

    def health(self) -> dict[str, object]: ...


@runtime_checkable
class ShowsWhenReady(Protocol):
    """A channel with something to show once the whole daemon is up (the terminal: the
    approval prompts still pending there, after the banner)."""

    async def ready(self) -> None: ...


@runtime_checkable
class MediaSource(Protocol):
    """A channel whose messages carry files (``Attachment``), fetched during the turn."""

    name: str

    async def fetch_media(
        self, attachment: Attachment, destination: Path, *, limit: int | None = None
    ) -> int:
        """Write the file to ``destination`` (complete, or not at all); its size in bytes.
        Raises ``MediaUnavailable`` when trying again will not help, anything else when
        it may (a network error). ``limit``: the most bytes the core's media budgets
        leave for it; a file larger than that (announced or as it streams in, when it is
        below the channel's own limit) raises ``MediaTooLarge``."""
        ...


@runtime_checkable
class PreviewSink(Protocol):
    """A channel that can show a reply while it is written (``echo_bot.previews``)."""

    name: str

    async def show_preview(self, to: Address, key: str, text: str) -> None:
        """Show ``text`` (the whole reply so far) for ``key``; returns when the channel
        is ready for the next text (it paces itself: texts in between are skipped)."""
        ...

    async def end_preview(self, to: Address, key: str) -> None:
        """The reply for ``key`` is no longer being written (its final message, if any,
        comes through ``send`` like every message)."""
        ...
