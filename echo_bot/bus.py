"""The bus: how channels hand work to the core, and the durable queues behind it.

A leaf module (stdlib, pydantic models from ``events``). The bus declares the inbox and
outbox interfaces; ``echo_bot.store`` implements them. Publishing commits the inbound to
the inbox *before* it returns, so a channel may acknowledge its peer (Telegram offset,
HTTP 202) as soon as ``publish`` returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from .errors import ConfigError
from .events import (
    Address,
    Attachment,
    DecisionVerb,
    InboundMessage,
    InboundStatus,
    OutboundMessage,
    Receipt,
    Sender,
)


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

    def may_approve(self, channel: str, user_id: str) -> bool:
        """Whether ``user_id`` is one of ``channel``'s approvers (the config's alone)."""
        ...

    async def pair(self, channel: str, user_id: str, code: str) -> str:
        """ "paired", "already", "wrong" or "locked"."""
        ...

    async def pairing_open(self) -> bool:
        """Whether a pairing code waits to be used: a channel may then let a stranger in
        far enough to send it (Matrix joins a stranger's direct chat only then)."""
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


class NoHttpServer(ConfigError):
    """A channel asked for HTTP routes in a daemon that serves no HTTP: a config error
    (the daemon starts its server when a channel needs it, see ``app.http_reasons``)."""


def delivery_lease(channel: str) -> str:
    """The lease (``ChannelHost.hold``) held by the daemon that sends ``channel``'s outbox,
    one of those that run it: a channel whose sending needs what only its receiving
    knows (Matrix: the rooms' members' keys) holds it to receive too."""
    return f"delivery:{channel}"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a channel can do, declared by the channel and read by the core (which wires
    media, previews and the after-start display from it, never by probing the object).

    ``media``, ``previews``, ``typing``, ``shows_when_ready``, ``reloads`` and
    ``diagnoses`` promise the methods of ``MediaSource``, ``PreviewSink``,
    ``ShowsTyping``, ``ShowsWhenReady``, ``live.Reloadable`` (``reload(config) ->
    list[str]``) and ``Diagnoses``; the others
    describe the network, for renderers and the channel contract suite
    (tests/channels/contract/).
    """

    buttons: bool = False  # inline buttons: an approval prompt is tapped, else typed
    edits: bool = False  # a delivered message can be edited (``edit_of``)
    previews: bool = False  # shows a reply while it is written (``PreviewSink``)
    media: bool = False  # its messages carry files fetched during the turn (``MediaSource``)
    reactions: bool = False  # messages can be reacted to
    threads: bool = False  # chats have threads (``Address.thread_id``)
    shows_when_ready: bool = False  # has something to show once all is up (``ready()``)
    rate_limited: bool = False  # its peer answers "too many requests"; sends are paced
    reloads: bool = False  # takes a new config live at SIGHUP (``reload(config)``)
    diagnoses: bool = False  # checks its own peer for ``echo-bot doctor`` (``Diagnoses``)
    # its first contact with its peer is the host's: ``connect()`` after ``start()``,
    # tried again while the peer is away (``Connects``, ``echo_bot.link``)
    connects: bool = False
    typing: bool = False  # shows "typing" while a turn runs (``ShowsTyping``)


class ChannelLink(Protocol):
    """A channel's connection as the host keeps it (``echo_bot.link.Link``): what the
    channel reports, what /healthz shows."""

    facts: dict[str, object]
    ok_after_connect: bool

    def connected(self, part: str = "peer") -> None: ...
    def back(self, part: str) -> None: ...
    def reconnecting(self, error: str, part: str = "peer") -> None: ...
    def refused(self, error: str) -> None: ...
    def count(self, fact: str) -> None: ...
    def state(self) -> dict[str, object]: ...

    async def pause(self) -> None: ...
    async def takes_turn(
        self, hold: Awaitable[bool], doing: str, now: str, elsewhere: str
    ) -> bool: ...

    async def receive(
        self, once: Callable[[], Awaitable[Any]], *, resume: Callable[[], Awaitable[Any]],
        turn: Callable[[], Awaitable[bool]] | None = None,
        away: tuple[type[BaseException], ...] = (), peer: str = "the peer",
    ) -> None:  # fmt: skip
        """The channel's receiving loop, its turn, resumption and errors kept here."""
        ...

    async def first_contact(self, connect: Callable[[], Awaitable[Any]]) -> None: ...
    async def close(self) -> None: ...


@runtime_checkable
class Connects(Protocol):
    """A channel whose first contact with its peer the host makes
    (``Capabilities.connects``): ``connect()`` raises ``errors.PeerAway`` while the peer
    is away (tried again) and ``ConfigError`` for what the owner must fix."""

    link: ChannelLink

    async def connect(self) -> None: ...


@dataclass(frozen=True)
class Decided:
    """What a decision given on a message came to: ``taken`` (handed to the gate, which
    checks who decides), ``refused`` (the message is a prompt that does not offer it),
    or ``no_prompt`` (the message is no prompt of this channel's)."""

    outcome: Literal["taken", "refused", "no_prompt"]
    chat: Address | None = None  # where the prompt went


class ChannelEdge(Protocol):
    """A channel's way in (``echo_bot.edge.Edge``)."""

    @property
    def help(self) -> str:
        """The help command as people type it on this network (``/help``, ``!help``)."""
        ...

    async def take(self, message: InboundMessage) -> str | None:
        """``message`` committed (its inbound ID), or None: from a stranger, who was
        answered (a pairing code taken, or refused with their ID). Raises
        ``errors.CommitFailed`` when the store did not take it: acknowledge nothing."""
        ...

    def approves(self, user_id: str) -> bool:
        """Whether ``user_id`` is one of this channel's approvers (``decide`` refuses
        anyone else before anything is stored)."""
        ...

    async def commit(self, message: InboundMessage) -> Published:
        """``message`` committed as it is, with whether it is a repeat: what ``take``
        does after its checks (a webhook answers a repeat itself). Raises
        ``errors.CommitFailed``."""
        ...

    async def notice(
        self, to: Address, text: str, *, quote: str | None = None, seldom: bool = False
    ) -> None:
        """A notice from the bot in ``to``, queued in order with the replies (``seldom``:
        at most once per 10 minutes per chat and text)."""
        ...

    async def pair(self, user_id: str, code: str) -> str:
        """The answer to a pairing ``code`` sent by ``user_id`` on this channel."""
        ...

    async def keep_prompt(self, message_id: str, message: OutboundMessage) -> None:
        """An approval prompt as sent (``message_id``: its id on the network), kept in
        the store: only what it offers may be decided on it (``decide``)."""
        ...

    async def decide(
        self, message_id: str, sender: Sender, external_id: str, *,
        action: str | None = None, verb: DecisionVerb | None = None, at: Address | None = None,
    ) -> Decided:  # fmt: skip
        """A decision given on message ``message_id`` (a button's ``action``, or a
        ``verb``): taken when that message is a kept prompt offering it, else refused
        and said (``echo_bot.edge.Decided``)."""
        ...

    async def refuse(self, to: Address, user_id: str, *, quote: str | None = None) -> None:
        """Tell a stranger in ``to`` their ID and the two ways in (at most once per 10
        minutes per person; audited)."""
        ...

    async def react(
        self, prompt_id: str, sender: Sender, external_id: str, key: str, at: Address
    ) -> None:
        """A reaction on message ``prompt_id`` (a network without buttons): the answer
        it means, decided (``echo_bot.approvals.answers``)."""
        ...

    async def reply(
        self, prompt_id: str, sender: Sender, external_id: str, text: str, at: Address
    ) -> bool:
        """A reply to message ``prompt_id`` as a typed answer; False when it is none (a
        message like any other)."""
        ...

    async def invited(self, inviter: str, *, direct: bool, where: str) -> str:
        """Whether to join a chat ``inviter`` invited the bot to: "join", "pair" (a
        stranger's direct invite while a code waits) or "refuse" (audited)."""
        ...

    async def lone_answer(self, to: Address, text: str, how: str) -> bool:
        """``approve`` / ``deny`` typed on its own while a request waits in ``to``: told
        ``how`` to answer instead (True)."""
        ...


class ChannelHost(Protocol):
    """What the runtime hands every channel: one required host, built by the core in one
    place (``echo_bot.channel_host``). Every part is always there; HTTP, which a daemon
    may not serve, is asked for with ``routes()`` (``NoHttpServer`` when absent)."""

    @property
    def bus(self) -> Bus:
        """Publish inbound (committed before it returns) and queue outbound."""
        ...

    @property
    def access(self) -> AccessControl:
        """Who may talk to a chat channel, and pairing."""
        ...

    def edge(
        self, channel: str, *, prefix: str = "/", pair_as: str = "as `pair CODE`"
    ) -> ChannelEdge:
        """``channel``'s way in (``echo_bot.edge``): every inbound is handed to its
        ``take`` (allowlist, pairing, a stranger's refusal, the commit), every notice
        to its ``notice``."""
        ...

    def link(self, channel: str) -> ChannelLink:
        """``channel``'s connection to its peer, as /healthz shows it: the channel says
        connected, reconnecting or refused; the host logs each change once."""
        ...

    @property
    def masker(self) -> Masking:
        """The configured secrets: what a channel made of a (masked) text is masked again."""
        ...

    @property
    def environ(self) -> Mapping[str, str]:
        """The daemon's environment (tokens and route secrets by their variable's name)."""
        ...

    @property
    def commands(self) -> Sequence[tuple[str, str]]:
        """The core's chat commands (name, help), for a network's command menu."""
        ...

    @property
    def state_dir(self) -> Path:
        """The daemon's state dir: a channel keeps files of its own in
        ``state_dir/<name>/`` (the Matrix channel's encryption keys)."""
        ...

    @property
    def started_at(self) -> float:
        """When the daemon started: outbound made before it waited for a channel of an
        earlier run (or one that was not running), e.g. a reply whose terminal closed."""
        ...

    @property
    def shared(self) -> bool:
        """Several daemons share the store: one-at-a-time work asks ``hold`` first."""
        ...

    @property
    def serves_http(self) -> bool: ...

    def routes(self) -> Routes:
        """The core's HTTP server; raises ``NoHttpServer`` when the daemon serves none."""
        ...

    def add_health(self, name: str, check: Callable[[], dict[str, Any]]) -> None:
        """Report ``check`` on /healthz (nothing to do without an HTTP server)."""
        ...

    async def audit(self, event: str, **data: Any) -> None:
        """Record an event in the audit log (masked), e.g. a refused webhook delivery."""
        ...

    async def pending_prompts(self, to: Address) -> list[OutboundMessage]:
        """The prompts of the approvals still pending for ``to``, built anew (as
        approvals/display.py renders them; a terminal shows them again after a restart)."""
        ...

    async def timezone_for(self, to: Address) -> str:
        """The time zone a chat reads times in (its /timezone, else [bot] timezone)."""
        ...

    def request_stop(self, exit_code: int = 0) -> None:
        """End the daemon; ``exit_code`` also sets its exit status."""
        ...

    def detach(self, channel: str) -> None:
        """``channel`` takes nothing more in this run (a terminal whose output closed):
        its messages wait in the outbox, none is failed."""
        ...

    async def hold(self, name: str, within: float) -> bool:
        """Whether this daemon may do now the work only one daemon may do at a time
        (polling a Telegram bot) on a shared store; a holder unseen ``within`` seconds
        counts as gone. Always True when the store is not shared."""
        ...

    async def recall(self, name: str) -> tuple[int, float] | None:
        """A reader's position kept in the store (the Telegram poller's offset) and when
        it was stored, so the next poller goes on from it."""
        ...

    async def remember(self, name: str, value: int) -> None: ...

    async def recall_note(self, name: str) -> tuple[str, float] | None:
        """A text kept in the store under ``name`` (a Matrix sync token, an approval
        prompt's actions) and when it was stored; None when nothing is."""
        ...

    async def remember_note(self, name: str, value: str, *, replace: bool = True) -> None:
        """Keep ``value`` under ``name``, committed on return; with ``replace=False`` only
        when nothing is kept there yet (the first of several daemons to write wins: a
        secret each would make for itself)."""
        ...

    def stop_generation(self, key: str) -> bool:
        """The person asked to stop the reply being written for ``key`` (a preview's
        key); False when none is being written any more."""
        ...

    def argv_args(self, tool: str) -> Collection[str]:
        """The arguments of ``tool`` that become a command line (a webhook value must
        never begin one of their elements with '-')."""
        ...


@runtime_checkable
class Channel(Protocol):
    """A channel adapter. New channel = a module in ``channels/`` + one registry line
    (docs/CHANNELS.md). It is made with its config section (None for a channel without
    one), its options (the command line's, e.g. the terminal's streams) and the host."""

    name: str
    capabilities: Capabilities

    def __init__(self, section: Any, options: Mapping[str, Any], host: ChannelHost) -> None: ...

    async def start(self, bus: Bus) -> None: ...

    async def send(self, message: OutboundMessage) -> Receipt: ...

    async def stop(self) -> None: ...

    def health(self) -> dict[str, object]: ...


@runtime_checkable
class ShowsWhenReady(Protocol):
    """A channel with something to show once the whole daemon is up (the terminal: the
    approval prompts still pending there, after the banner)."""

    async def ready(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """One line of ``echo-bot doctor``: what was checked, its verdict, what to do."""

    name: str  # "matrix token"
    status: str  # DIAGNOSIS_OK, DIAGNOSIS_WARN or DIAGNOSIS_FAIL
    text: str


DIAGNOSIS_OK, DIAGNOSIS_WARN, DIAGNOSIS_FAIL = "ok", "warn", "FAIL"


class Diagnoses(Protocol):
    """A channel that checks its own peer for ``echo-bot doctor`` (the homeserver, the
    token, the keys): called on the class, with no daemon running (one may run beside
    it: nothing is changed), each request bounded by a timeout."""

    @staticmethod
    async def diagnose(
        section: Any, environ: Mapping[str, str], state_dir: Path
    ) -> list[Diagnosis]: ...


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
class ShowsTyping(Protocol):
    """A channel whose network shows a person typing (``echo_bot.typing_shown`` keeps
    when it shows, from a message's commit until its reply is on its way)."""

    name: str

    async def show_typing(self, to: Address, on: bool) -> float | None:
        """One typing notification in ``to``: the seconds until the next may go (it
        shows at least that long), or None when the chat shows none (refused there). A
        network error is the channel's to swallow. ``on=False``: it is over (for a
        network that shows typing until told otherwise; the answer is not read)."""
        ...


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
