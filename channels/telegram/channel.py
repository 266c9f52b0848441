"""The Telegram channel on aiogram 3: chat with the agent, approve from a phone.

Safety over aiogram's defaults: updates are fed one at a time and the polling offset
moves past an update only after it is committed to the inbox; in webhook mode the HTTP
answer is sent only after the commit. Replies go through the core's durable outbox.

This class is the wiring: the Bot and its Dispatcher, and the parts that do the work —
``poller`` (getUpdates) or ``webhook``, ``handlers`` (updates into the inbox),
``outbound`` (send, edit, files, pacing), ``previews`` (drafts), ``media``
(downloads); ``show_typing`` is how a chat shows the bot typing (the host's indicator
says when).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiogram import Bot, Dispatcher
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import TelegramAPIServer
from aiogram.exceptions import (
    AiogramError,
    TelegramAPIError,
    TelegramBadRequest,
    TelegramNetworkError,
    TelegramRetryAfter,
    TelegramServerError,
    TelegramUnauthorizedError,
)
from aiogram.types import BotCommand

from channels.parts import ThroughParts
from echo_bot.bus import Bus, Capabilities, ChannelHost, Diagnosis
from echo_bot.errors import ConfigError, PeerAway
from echo_bot.events import Address

from .common import Me, Tasks, log
from .doctor import diagnose
from .handlers import Handlers
from .media import Downloads
from .outbound import Outbound
from .poller import ALLOWED_UPDATES, Poller
from .previews import Previews
from .render import TYPING_INTERVAL, telegram_pacer
from .settings import TelegramConfig
from .webhook import Webhook

# What a Bot API that cannot be reached (or fails on its side) raises: tried again later.
UNREACHABLE = (AiogramError, TimeoutError, OSError)


class TelegramChannel(ThroughParts):
    name = "telegram"
    capabilities = Capabilities(
        buttons=True,
        edits=True,
        previews=True,
        media=True,
        reactions=True,
        threads=True,
        rate_limited=True,
        diagnoses=True,
        connects=True,
        typing=True,
    )
    previews: Previews

    def __init__(
        self, section: TelegramConfig, options: Mapping[str, Any], host: ChannelHost
    ) -> None:
        config = section
        self.config = config
        self.host = host
        # A token of a bot token's shape: the host made the channel only after its spec
        # found no problem in the environment (config.check_environment).
        token = host.environ.get(config.token_env, "")
        session = AiohttpSession(api=TelegramAPIServer.from_base(config.api_base.rstrip("/")))
        self.bot = Bot(token, session=session)
        self.commands = list(host.commands)
        self.bus = host.bus
        self.pacer = telegram_pacer()
        self.me = Me()
        self.link = host.link("telegram")
        self.link.facts["mode"] = config.mode
        self._tasks = Tasks()
        self._left_previews: list[tuple[Address, str]] = []
        self.previews = Previews(host, self.bot, self.pacer, self._tasks)
        self.outbound = Outbound(host, self.bot, self.pacer, self.previews, self._tasks)
        self.downloads = Downloads(self.bot, config)
        self.handlers = Handlers(config, host, self.bot, self.me, self._tasks)
        self.dp = Dispatcher()
        self.dp.include_router(self.handlers.router(self.previews))
        self.poller = Poller(config, options, host, self.bot, self.dp, self.link)
        self.webhook = Webhook(config, host, self.bot, self.dp)
        if config.mode == "webhook":  # the daemon serves HTTP then (app.http_reasons)
            self.webhook.register()

    @property
    def bot_id(self) -> int | None:
        return self.me.bot_id

    @property
    def username(self) -> str | None:
        return self.me.username

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self, bus: Bus) -> None:
        """Nothing to open before the Bot API answers (the host's first contact is
        ``connect``); the preview messages the last run left are read, to remove."""
        self._left_previews = await self.previews.ledger.left_over()

    async def connect(self) -> None:
        """Who the bot is, its menu, then polling or the webhook. A refused token (or
        webhook) is the user's to fix; a Bot API that cannot be reached is tried again
        by the host (``Link.first_contact``) while the daemon runs."""
        try:
            me = await self.bot.get_me()
            await self._connected(me.id, me.username)
        except TelegramUnauthorizedError:
            raise ConfigError(
                f"telegram.token_env: the Bot API at {self.config.api_base} rejected the"
                f" token in ${self.config.token_env} (401 Unauthorized)"
            ) from None
        except UNREACHABLE as exc:
            raise PeerAway(f"cannot reach the Bot API: {exc}") from None

    async def _connected(self, bot_id: int, username: str | None) -> None:
        self.me.bot_id, self.me.username = bot_id, username
        with contextlib.suppress(TelegramAPIError, OSError, TimeoutError):
            await self.bot.set_my_commands(
                [BotCommand(command=name, description=text[:256]) for name, text in self._menu()]
            )
        if self.config.mode == "webhook":
            try:
                await self.bot.set_webhook(
                    url=self.config.webhook_url or "",
                    secret_token=self.webhook.secret or None,
                    allowed_updates=ALLOWED_UPDATES,
                    drop_pending_updates=False,
                )
            except TelegramBadRequest as exc:
                raise ConfigError(
                    f"telegram.webhook_url: the Bot API refused the webhook: {exc.message}"
                ) from None
        else:
            await self.bot.delete_webhook(drop_pending_updates=False)
            self._tasks.spawn(self.poller.run())
        left, self._left_previews = self._left_previews, []
        if left:
            self._tasks.spawn(self.previews.remove_left_over(left))
        log.info("telegram: connected as @%s", username)
        self.link.facts["bot"] = f"@{username}" if username else None

    @staticmethod
    async def diagnose(
        section: TelegramConfig, environ: Mapping[str, str], state_dir: Path
    ) -> list[Diagnosis]:
        return await diagnose(section, environ, state_dir)

    async def stop(self) -> None:
        await self._tasks.cancel_all()
        await self.bot.session.close()

    async def show_typing(self, to: Address, on: bool) -> float | None:
        """One "typing…" (Telegram shows it 5 s, or until the bot's next message) when
        the overall budget has room to spare: replies never queue behind typing."""
        if not on:
            return None  # it ends by itself
        wait = self.pacer.spare(None)
        if wait > 0:
            return wait
        try:
            await self.bot.send_chat_action(
                chat_id=int(to.chat_id), action="typing",
                message_thread_id=int(to.thread_id) if to.thread_id else None,
            )  # fmt: skip
        except TelegramRetryAfter as exc:
            return float(exc.retry_after)
        except (TelegramNetworkError, TelegramServerError, OSError, TimeoutError):
            pass  # the next beat tries again
        except (AiogramError, ValueError):
            return None  # blocked, gone, refused: this chat shows no typing
        return TYPING_INTERVAL

    def _menu(self) -> list[tuple[str, str]]:
        own = [("start", "say hello"), ("whoami", "show your Telegram user id"),
               ("pair", "pair with the code from `echo-bot pair`")]  # fmt: skip
        names = {n for n, _ in own}
        return own + [(n, h) for n, h in self.commands if n not in names]

    # -- what the core calls ----------------------------------------------------------------
