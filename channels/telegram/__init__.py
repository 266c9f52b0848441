"""The Telegram channel on aiogram 3: chat with the agent, approve from a phone.

The registry names ``channels.telegram:TelegramChannel``. The package follows aiogram's
own seams: ``channel`` (the wiring), ``poller`` and ``webhook`` (updates in, committed
before they are acknowledged), ``handlers`` (updates into InboundMessages), ``outbound``
(send, edit, files), ``previews`` (drafts, typing), ``media`` (files in messages),
``text``/``markdown``/``masking``/``render`` (what a text becomes in Telegram).
"""

from __future__ import annotations

from .channel import TelegramChannel
from .previews import PREVIEW_MARK
from .text import message_parts, preview_part

__all__ = ["PREVIEW_MARK", "TelegramChannel", "message_parts", "preview_part"]
