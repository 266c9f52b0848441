"""What the gateway delivers, as inbounds: direct messages, and in guild channels a
mention of the bot or a reply to one of its messages, become ``MessageInbound``
(external_id: the message's ID, so one delivered twice — a RESUME's replay, a catch-up
— is one inbound); a button press on a prompt is a decision.

**Committed in order, never lost.** The gateway has no acknowledgement to hold back:
messages the bot answers are queued as they arrive (``arrived``, before any ``await``)
and committed one at a time, each tried again until the store takes it. Each answered
channel's position (its last committed message) is kept as a store note; at a new
session (a RESUME replays by itself) or a restart, what came since is read back over
REST into the same queue, and what arrives meanwhile waits behind it — within
CATCH_UP_AGE, CATCH_UP_CHANNELS (the most recent first) and, of each channel, its
newest CATCH_UP_MESSAGES (a busy channel's position moves only at what the bot
answers: its oldest thousand since could all predate a mention made while it was
away). A channel whose read-back failed keeps its position (a message committed
meanwhile does not move it past the gap) and is read back again after a pause; one
Discord says is gone (404) is dropped. Chats with no position yet (the allowed users'
DMs, the listed channels) are read back from CATCH_UP_AGE: a first message made while
the bot was away would otherwise never be read.

Commands: Discord's client takes ``/word`` for its own slash commands, so echo-bot's
are typed with ``!`` (``!help``).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from typing import Any

import aiohttp
import discord

from channels.parts import Tasks, clean
from echo_bot.bus import ChannelEdge, ChannelHost
from echo_bot.errors import CommitFailed
from echo_bot.events import DIRECT, MessageInbound, Sender

from .common import address_of, log
from .media import read_files
from .settings import DiscordConfig

MAX_TEXT = 4_000  # characters of a message taken (Discord's own limit, with Nitro)
POSITIONS = "discord.positions"  # the store note: channel → [last id, guild, parent]
CATCH_UP_CHANNELS = 50
CATCH_UP_MESSAGES = 1_000  # per channel (10 REST pages)
CATCH_UP_AGE = 24 * 3600.0  # seconds: older messages are not answered late
SAVE_EVERY = 5.0  # seconds between two writes of the positions
READ_BACK_PAUSES = (2.0, 600.0)  # seconds before a failed read-back is tried again: first, most
COMMIT_WAIT_MAX = 30.0
TAKEN_TYPES = frozenset({discord.MessageType.default, discord.MessageType.reply})
QUEUE_MAX = 10_000  # messages waiting for their commit; past it, read back later
Position = list[int]  # [last committed message id, guild id or 0, parent channel id or 0]
Arrived = tuple[discord.Message, tuple[int, int]]  # a message the bot answers, and where
UNREAD = (
    "I could not read that message: Discord sent it to me without its text (a sticker, a"
    " forward, or a reply when the bot reads only what mentions it). Write it as text."
)

BARE = "Yes? Write your message after the mention (@bot what time is it?)."


class Inbound:
    def __init__(
        self, config: DiscordConfig, host: ChannelHost, edge: ChannelEdge, tasks: Tasks
    ) -> None:
        self.config, self.host, self.edge, self.tasks = config, host, edge, tasks
        self.client: discord.Client | None = None  # once signed in
        self.queue: asyncio.Queue[Arrived] = asyncio.Queue()
        self.positions: dict[str, Position] = {}
        self._changed = False
        self._first_seen = False  # a channel new to the positions: saved at once
        self._catching = 0  # catch-ups under way: what arrives meanwhile waits behind them
        self._held: list[Arrived] = []
        self._overflowed = False  # the queue was full: dropped, read back once it drains
        self._behind: set[str] = set()  # channels whose read-back failed: positions wait
        self._retrying = False
        self._dms: dict[str, int] = {}  # person → their DM channel's id, once opened
        self._listed: dict[str, tuple[int, int] | None] = {}  # listed → (id, guild), or None

    async def load(self) -> None:
        """The positions kept by the last run (a note it may have left malformed)."""
        note = await self.host.recall_note(POSITIONS)
        try:
            kept = json.loads(note[0]) if note else {}
        except ValueError:
            kept = {}
        if isinstance(kept, dict):
            self.positions = {
                str(k): [int(n) for n in v] for k, v in kept.items()
                if isinstance(v, list) and len(v) == 3 and all(isinstance(n, int) for n in v)
            }  # fmt: skip

    def arrived(self, message: discord.Message) -> None:
        """A message from the gateway: queued when the bot answers it (behind a catch-up
        under way). A full queue drops it and what follows until it drains, then reads
        them back: a channel's position never passes a message not committed."""
        where = self._answered(message)
        if where is None:
            return
        if self._catching:
            self._held.append((message, where))
        elif self._overflowed or self.queue.qsize() >= QUEUE_MAX:
            if not self._overflowed:
                log.warning("discord: %d messages wait for the store; read back later", QUEUE_MAX)
            self._overflowed = True
        else:
            self.queue.put_nowait((message, where))

    async def run(self) -> None:
        """Commit what arrives, one at a time, in order (a background task)."""
        self.tasks.spawn(self._save_positions())
        while True:
            message, where = await self.queue.get()
            try:
                await self._take(message, where)
            except Exception:  # one odd message never stops the others
                log.exception("discord: message %s could not be read", message.id)
            if self._first_seen:  # not left to SAVE_EVERY: killed meanwhile, the next
                self._first_seen = False  # start would not read this channel back
                await self._saved()
            if self._overflowed and self.queue.empty():
                self._overflowed = False
                self.new_session()

    async def _take(self, message: discord.Message, where: tuple[int, int]) -> None:
        guild, parent = where
        attachments, notes = read_files(message.attachments, self.config)
        text = "\n".join(part for part in [self._text(message), *notes] if part) or None
        if text is None and not attachments:  # a sticker, a forward, a reply without the intent
            said = BARE if message.content.strip() else UNREAD  # or "@bot" alone
            await self.edge.notice(address_of(message.channel.id), said, seldom=True)
            self._moved(str(message.channel.id), [message.id, guild, parent])
            return
        author = message.author
        inbound = MessageInbound(
            address=address_of(message.channel.id),
            sender=Sender(id=str(author.id), name=clean(author.display_name)[:100]),
            text=text, attachments=attachments, external_id=str(message.id),
            message_id=str(message.id), metadata={} if guild else {DIRECT: True},
        )  # fmt: skip
        wait = 0.5
        while True:
            try:
                await self.edge.take(inbound)
                break
            except CommitFailed as exc:  # no redelivery: tried until the store takes it
                log.warning("discord: message %s not committed (%s); trying again", message.id, exc)
                await asyncio.sleep(wait)
                wait = min(wait * 2, COMMIT_WAIT_MAX)
        self._moved(str(message.channel.id), [message.id, guild, parent])

    def _answered(self, message: discord.Message) -> tuple[int, int] | None:
        """(guild, parent channel), 0 where none, of a message the bot answers; None for
        the rest: its own and other bots' messages, system messages, in a guild anything
        but a mention of the bot or a reply to it, or outside ``guilds``/``channels``."""
        me = self.client.user if self.client is not None else None
        if me is None or message.author.bot or message.author.id == me.id:
            return None
        if message.type not in TAKEN_TYPES:
            return None
        kept = self.positions.get(str(message.channel.id), [0, 0, 0])
        guild = message.guild.id if message.guild else getattr(message.channel, "guild_id", None)
        if not guild:
            return (0, 0) if isinstance(message.channel, discord.DMChannel) or not kept[1] else None
        parent = getattr(message.channel, "parent_id", None) or kept[2]
        role = message.guild.self_role if message.guild else None  # "@bot" may pick its role
        mentioned = me.id in message.raw_mentions or any(u.id == me.id for u in message.mentions)
        mentioned |= role is not None and role.id in message.raw_role_mentions
        replied = message.reference is not None and isinstance(
            message.reference.resolved, discord.Message
        ) and message.reference.resolved.author.id == me.id  # fmt: skip
        listed = (self.config.guilds is None or str(guild) in self.config.guilds) and (
            self.config.channels is None
            or bool({str(message.channel.id), str(parent)} & set(self.config.channels))
        )
        return (guild, parent) if (mentioned or replied) and listed else None

    def _text(self, message: discord.Message) -> str:
        """The text as the agent reads it: clean, the bot's own mention left out (its
        user's, or its managed role's: "@bot" may pick either, and `!help` after it is
        still a command)."""
        me = self.client.user if self.client is not None else None
        text = clean(message.content[:MAX_TEXT])
        if me is not None:
            text = text.replace(f"<@{me.id}>", "").replace(f"<@!{me.id}>", "")
        role = message.guild.self_role if message.guild else None
        if role is not None:
            text = text.replace(f"<@&{role.id}>", "")
        return text.strip()

    # -- positions and the catch-up -------------------------------------------------------
    def _moved(self, channel: str, position: Position) -> None:
        if channel in self._behind or position[0] <= self.positions.get(channel, [0])[0]:
            return
        self._first_seen |= channel not in self.positions
        self.positions.pop(channel, None)  # the most recent last
        self.positions[channel] = position
        while len(self.positions) > CATCH_UP_CHANNELS:
            self.positions.pop(next(iter(self.positions)))
        self._changed = True

    async def save(self) -> None:
        if self._changed:
            self._changed = False
            await self.host.remember_note(POSITIONS, json.dumps(self.positions))

    async def _save_positions(self) -> None:
        while True:
            await asyncio.sleep(SAVE_EVERY)
            await self._saved()

    async def _saved(self) -> None:
        try:
            await self.save()
        except Exception as exc:  # the store away: kept for the next try
            self._changed = True
            log.warning("discord: positions not saved (%s)", exc)

    def new_session(self) -> None:
        """A new gateway session (not a RESUME): what came since each channel's position
        is read back, and what arrives meanwhile waits behind it."""
        self._catching += 1
        self.tasks.spawn(self._catch_up())

    async def _catch_up(self, only: set[str] | None = None) -> None:
        try:
            ago = datetime.datetime.fromtimestamp(time.time() - CATCH_UP_AGE, datetime.UTC)
            oldest = discord.utils.time_snowflake(ago)
            for channel, (last, guild, _parent) in reversed(list(self.positions.items())):
                if only is not None and channel not in only:
                    continue
                if await self._read_back(int(channel), guild, max(last, oldest)):
                    self._behind.discard(channel)
                else:
                    self._behind.add(channel)
            if only is None:
                await self._read_unplaced(oldest)
        finally:
            self._catching -= 1
            if not self._catching:
                held, self._held = self._held, []
                for item in held:
                    self.queue.put_nowait(item)
        if self._behind and not self._retrying:
            self.tasks.spawn(self._again())

    async def _again(self) -> None:
        """The channels whose read-back failed, read back again after a pause that grows
        until each one's succeeds (a new session's catch-up reads them too)."""
        self._retrying = True
        try:
            pause = READ_BACK_PAUSES[0]
            while self._behind:
                await asyncio.sleep(pause)
                pause = min(pause * 2, READ_BACK_PAUSES[1])
                self._behind &= set(self.positions)  # one no longer kept: nothing to read
                self._catching += 1
                await self._catch_up(only=set(self._behind))
        finally:
            self._retrying = False

    async def _read_unplaced(self, oldest: int) -> None:
        """The chats with no position where a first message may have come while the bot
        was away: the allowed users' and approvers' DMs, and the listed ``channels``
        (their threads not: each is a channel of its own). Read from CATCH_UP_AGE; one
        whose reading fails gets that as its position and is read again as any other
        (a message answered meanwhile does not move it past the gap)."""
        client = self.client
        if client is None:
            return
        unplaced: list[tuple[int, int]] = []  # (channel, guild)
        for person in dict.fromkeys([*self.config.allowed_users, *self.config.approver_ids]):
            dm = self._dms.get(person)  # opened once a run (READY forgets every DM)
            if dm is None:
                try:
                    opened = await client.create_dm(discord.Object(int(person)))
                except Exception as exc:
                    log.warning("discord: the DM of %s could not be opened (%s)", person, exc)
                    continue
                dm = self._dms[person] = opened.id
            unplaced.append((dm, 0))
        for listed in self.config.channels or []:
            if listed in self.positions:
                continue
            if listed not in self._listed:  # looked up once a run, as a DM is opened
                try:  # its guild: a guild's channels are not known yet at a new session
                    found = await client.fetch_channel(int(listed))
                except Exception as exc:
                    log.warning("discord: channel %s could not be read (%s)", listed, exc)
                    continue
                guild = getattr(found, "guild", None)
                # A guild's channel that holds messages (not a DM's, a category, a forum).
                messageable = isinstance(found, discord.abc.Messageable)
                self._listed[listed] = (
                    (found.id, guild.id) if guild is not None and messageable else None
                )
            if (where := self._listed[listed]) is not None:
                unplaced.append(where)
        for channel, guild in unplaced:
            if str(channel) not in self.positions and not await self._read_back(
                channel, guild, oldest
            ):
                self._moved(str(channel), [oldest, guild, 0])
                self._behind.add(str(channel))

    async def _read_back(self, channel: int, guild: int, after: int) -> bool:
        """One channel's newest CATCH_UP_MESSAGES after ``after``, queued oldest first;
        False, nothing queued, when reading failed (refused, away, rate limited past the
        wait, malformed): its position then waits for a read-back that succeeds."""
        if self.client is None:
            return False
        chat: Any = self.client.get_channel(channel)
        chat = chat or self.client.get_partial_messageable(channel, guild_id=guild or None)
        try:
            read = [
                message async for message in chat.history(
                    limit=CATCH_UP_MESSAGES, after=discord.Object(id=after), oldest_first=False
                )
            ]  # fmt: skip
        except discord.NotFound:  # deleted, or never there: nothing will ever be read
            log.warning("discord: %s is gone; not read back again", channel)
            if self.positions.pop(str(channel), None) is not None:
                self._changed = True
            return True
        except Exception as exc:
            log.warning("discord: reading back %s failed (%s); tried again later", channel, exc)
            return False
        for message in reversed(read):
            if (where := self._answered(message)) is not None:
                self.queue.put_nowait((message, where))
        return True

    # -- button presses -------------------------------------------------------------------
    async def pressed(self, interaction: discord.Interaction) -> None:
        """A press, decided (committed) and only then acknowledged with a deferred
        update (Discord's 3 s): not committed, the press is left unanswered and
        Discord tells the presser it failed."""
        if interaction.type is not discord.InteractionType.component:
            return
        data: Any = interaction.data or {}
        action, message = data.get("custom_id"), interaction.message
        channel = interaction.channel_id
        if not isinstance(action, str) or message is None or channel is None:
            return
        user = interaction.user
        sender = Sender(id=str(user.id), name=clean(user.display_name)[:100])
        try:
            await self.edge.decide(
                f"{channel}:{message.id}", sender, f"press:{interaction.id}",
                action=action[:100], at=address_of(channel),
            )  # fmt: skip
        except CommitFailed as exc:
            log.warning("discord: a press was not committed (%s); left unanswered", exc)
            return
        try:
            await interaction.response.defer()
        except (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.info("discord: the press's acknowledgement failed (%s)", exc)
