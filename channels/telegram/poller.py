"""Long polling with commit before acknowledgement.

aiogram's own polling (``Dispatcher._listen_updates``) moves the offset past a batch as
soon as it is fetched, before its handlers finish; so this loop polls itself: updates are
fed one at a time through ``Dispatcher.feed_update``, and the offset moves past an update
only after it is committed to the inbox (a CommitFailed stops the batch; the update is
fetched again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, cast

from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.exceptions import (
    AiogramError,
    ClientDecodeError,
    TelegramRetryAfter,
    TelegramUnauthorizedError,
)
from aiogram.methods import GetUpdates
from aiogram.types import Update

from echo_bot.bus import ChannelHost, ChannelLink
from echo_bot.errors import StoreError
from echo_bot.link import STANDBY_CHECK

from .common import CommitFailed, log, unreadable
from .settings import TelegramConfig

ALLOWED_UPDATES = ["message", "edited_message", "callback_query", "stopped_message_generation"]
# A stored offset older than this is not used: Telegram keeps unconfirmed updates for 24
# hours only, and after a week without updates it numbers the next ones afresh, maybe
# below an old offset (which would confirm them unseen).
OFFSET_MAX_AGE = 23 * 3600.0


class Poller:
    """getUpdates in a loop, for as long as this daemon may poll the bot."""

    def __init__(
        self,
        config: TelegramConfig,
        options: Mapping[str, Any],
        host: ChannelHost,
        bot: Bot,
        dp: Dispatcher,
        link: ChannelLink,
    ) -> None:
        self.config = config
        self.host = host
        self.bot = bot
        self.dp = dp
        self.link = link
        self.poll_timeout = int(options.get("poll_timeout", 25))
        self._unreadable: set[int] = set()  # update ids aiogram could not read
        self.offset: int | None = None  # past the last update the inbox took

    async def run(self) -> None:
        """getUpdates (``Link.receive``) for as long as the channel runs."""
        turn = self._may_poll if self.host.shared else None
        await self.link.receive(self._once, resume=self._resume, turn=turn)

    async def _resume(self) -> None:
        self.offset = await self._stored_offset()

    async def _once(self) -> None:
        updates = await self._fetch(self.offset)
        if updates is None:
            return
        self.link.connected()  # the waits after failures start again from the shortest
        self.offset = await self._feed(updates, self.offset)
        if updates and self.offset is not None:
            await self._store_offset(self.offset)

    async def _fetch(self, offset: int | None) -> list[Update] | None:
        """The next batch; None after a failure (waited out: the caller asks again)."""
        try:
            return await self.bot(
                GetUpdates(
                    offset=offset, timeout=self.poll_timeout, allowed_updates=ALLOWED_UPDATES
                ),
                request_timeout=self.poll_timeout + 15,
            )
        except TelegramRetryAfter as exc:
            await asyncio.sleep(exc.retry_after)
            return None
        except TelegramUnauthorizedError:
            self.link.refused("getUpdates: the Bot API rejected the token (401)")
            await asyncio.sleep(60)  # asked again: a token revoked in error comes back
            return None
        except ClientDecodeError:
            # One update aiogram cannot read would fail every batch it is in, for
            # ever: read this batch one update at a time and skip what cannot be read.
            try:
                return await self._updates_one_by_one(offset)
            except (AiogramError, TimeoutError, OSError, ValueError) as exc:
                await self._failed(exc)
                return None
        except (AiogramError, TimeoutError, OSError) as exc:
            await self._failed(exc)
            return None

    async def _failed(self, exc: BaseException) -> None:
        self.link.reconnecting(f"getUpdates failed: {exc}")
        await self.link.pause()

    async def _feed(self, updates: list[Update], offset: int | None) -> int | None:
        """Each update through the dispatcher, in order; the offset past the last one
        the inbox took (or that was unreadable or bad, never to be handled)."""
        for update in updates:
            if update.update_id in self._unreadable:  # logged when read: skipped
                self._unreadable.discard(update.update_id)
                offset = update.update_id + 1
                continue
            try:
                await self.dp.feed_update(self.bot, update)
            except (CommitFailed, StoreError):  # not taken, or who sent it not read
                log.error("telegram: update %s not stored; will fetch it again", update.update_id)
                await asyncio.sleep(1)
                break
            except Exception:  # a bad update must not stall the queue forever
                log.exception("telegram: update %s could not be handled", update.update_id)
            offset = update.update_id + 1
        return offset

    async def _updates_one_by_one(self, offset: int | None) -> list[Update]:
        """The batch at ``offset`` fetched as raw JSON and read update by update; one
        that cannot be read is logged and stands in as a bare update, so the offset
        moves past it (it is never handled)."""
        session = await cast(AiohttpSession, self.bot.session).create_session()
        url = self.bot.session.api.api_url(self.bot.token, "getUpdates")
        body = {"timeout": 0, "allowed_updates": ALLOWED_UPDATES}
        if offset is not None:
            body["offset"] = offset
        async with asyncio.timeout(30), session.post(url, json=body) as response:
            data = await response.json(content_type=None)
        if (
            not isinstance(data, dict)
            or not data.get("ok")
            or not isinstance(data.get("result"), list)
        ):
            raise ValueError("getUpdates gave no list of updates")
        updates = []
        for raw in data["result"]:
            update_id = raw.get("update_id") if isinstance(raw, dict) else None
            if not isinstance(update_id, int):
                continue  # without an id nothing can be skipped past it either
            try:
                updates.append(Update.model_validate(raw, context={"bot": self.bot}))
            except ValueError as exc:
                unreadable(update_id, raw, exc)
                updates.append(Update(update_id=update_id))
                self._unreadable.add(update_id)
        return updates

    async def _stored_offset(self) -> int | None:
        """Where the last poller of this bot stopped (this daemon before a restart, or
        another daemon), so that what it stored is not fetched again. None, and Telegram's
        own unconfirmed updates (deduplicated by update_id), when nothing is stored, the
        store cannot say, or the offset is older than OFFSET_MAX_AGE."""
        try:
            stored = await self.host.recall(self._offset_name)
        except Exception as exc:
            log.warning("telegram: the stored offset could not be read (%s); asking afresh", exc)
            return None
        if stored is None:
            return None
        offset, stored_at = stored
        if time.time() - stored_at > OFFSET_MAX_AGE:
            return None
        return offset

    async def _store_offset(self, offset: int) -> None:
        """Keep the offset past what is stored: it is a shortcut, not the record (the inbox
        is), so a failure to keep it costs a few updates fetched again, never one lost."""
        try:
            await self.host.remember(self._offset_name, offset)
        except Exception as exc:
            log.debug("telegram: offset %s not stored: %s", offset, exc)

    @property
    def _offset_name(self) -> str:
        return f"telegram-offset:{self.bot.id}"

    async def _may_poll(self) -> bool:
        """With several daemons on one store, one polls this bot at a time; the others
        stand by and take over once its lease lapses (what it had not confirmed is
        fetched again and deduplicated by update_id)."""
        # Its holder counts as gone after lease - STANDBY_CHECK unseen: with the link's
        # look every STANDBY_CHECK, the poll is taken over within [telegram] lease.
        within = self.config.lease.total_seconds() - STANDBY_CHECK
        hold = self.host.hold(f"telegram-poller:{self.bot.id}", within)
        return await self.link.takes_turn(hold, "poll", "polling now", "another daemon polls")
