"""The Telegram channel on aiogram 3: chat with the agent, approve from a phone.

The registry names ``channels.telegram:TelegramChannel``; the package is laid out along
aiogram's own seams (see docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from .channel import PREVIEW_MARK, TelegramChannel, message_parts, preview_part

__all__ = ["PREVIEW_MARK", "TelegramChannel", "message_parts", "preview_part"]
