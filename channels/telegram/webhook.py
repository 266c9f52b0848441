"""Webhook mode: Telegram POSTs each update; the HTTP answer is sent only after the
update is committed to the inbox (a 503 makes Telegram send it again)."""

from __future__ import annotations

import hmac
import json
from typing import Any
from urllib.parse import urlsplit

from aiogram import Bot, Dispatcher
from aiogram.types import Update

from echo_bot.bus import ChannelHost, Routes

from .common import CommitFailed, log
from .settings import TelegramConfig


class Webhook:
    """The route Telegram's webhook posts to (registered by the channel)."""

    def __init__(self, config: TelegramConfig, host: ChannelHost, bot: Bot, dp: Dispatcher) -> None:
        self.bot = bot
        self.dp = dp
        self.host = host
        self.secret = host.environ.get(config.webhook_secret_env, "")
        self.path = urlsplit(config.webhook_url or "").path or "/telegram"

    @property
    def routes(self) -> Routes:
        """The core's HTTP server (there in webhook mode: ``NoHttpServer`` otherwise)."""
        return self.host.routes()

    async def handle(self, request: Any) -> Any:
        from aiohttp import web
        from pydantic import ValidationError

        given = request.headers.get("X-Telegram-Bot-Api-Secret-Token", "")
        if not self.secret or not hmac.compare_digest(given.encode(), self.secret.encode()):
            return web.json_response({"error": "bad or missing secret token"}, status=401)
        body = await self.routes.read_body(request, key=self.path)
        if isinstance(body, web.Response):
            return body
        try:
            data = json.loads(body)
            update = Update.model_validate(data, context={"bot": self.bot})
        except (ValueError, ValidationError):
            return web.json_response({"error": "not a Telegram update"}, status=400)
        try:
            await self.dp.feed_update(self.bot, update)
        except CommitFailed:
            return web.json_response({"error": "not stored; retry"}, status=503)
        except Exception:
            log.exception("telegram: update %s could not be handled", update.update_id)
        return web.json_response({"ok": True})
