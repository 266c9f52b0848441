"""Webhook mode: Telegram POSTs each update to the core's HTTP server, answered only
after the update is committed to the inbox (``echo_bot.http_deliveries``: a 503 makes
Telegram send it again); the secret token is a header, checked before the body is read."""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from aiogram import Bot, Dispatcher
from aiogram.types import Update

from echo_bot.bus import ChannelHost
from echo_bot.http_deliveries import DeliveryRoute, NotADelivery

from .common import unreadable
from .settings import TelegramConfig


class Webhook:
    """The route Telegram's webhook posts to (registered by the channel in webhook mode)."""

    def __init__(self, config: TelegramConfig, host: ChannelHost, bot: Bot, dp: Dispatcher) -> None:
        self.bot = bot
        self.dp = dp
        self.host = host
        self.secret = host.environ.get(config.webhook_secret_env, "")
        self.path = urlsplit(config.webhook_url or "").path or "/telegram"

    def register(self) -> None:
        """On the core's HTTP server (there in webhook mode: ``NoHttpServer`` otherwise)."""
        DeliveryRoute(self.host.routes(), self.path, self.take, network="telegram",
                      head_ok=self.signed)  # fmt: skip

    def signed(self, headers: Mapping[str, str]) -> bool:
        given = headers.get("X-Telegram-Bot-Api-Secret-Token", "")
        return bool(self.secret) and hmac.compare_digest(given.encode(), self.secret.encode())

    async def take(self, body: bytes, headers: Mapping[str, str]) -> Any:
        """An update, handled; one with its id that aiogram cannot read (from Telegram:
        the secret was checked) is skipped, answered 200 so Telegram does not send it
        again and again while it holds the ones after it."""
        try:
            raw = json.loads(body)
        except ValueError:
            raise NotADelivery("not a Telegram update") from None
        update_id = raw.get("update_id") if isinstance(raw, dict) else None
        if not isinstance(update_id, int) or isinstance(update_id, bool):
            raise NotADelivery("not a Telegram update")
        try:
            update = Update.model_validate(raw, context={"bot": self.bot})
        except ValueError as exc:  # pydantic's ValidationError among them
            unreadable(update_id, raw, exc)
            return {"ok": True}
        await self.dp.feed_update(self.bot, update)
        return {"ok": True}
