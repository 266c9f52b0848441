"""One-time codes for approvals by mail. A reply's From: proves nothing, so a prompt
carries a code made for that prompt and that approver (an HMAC under a key kept in
the store), and a reply decides only when it holds that code: a forged reply lacks it,
and a code read off one prompt decides no other prompt and for no other person. Once
the request is decided, the gate takes no second decision: the code is spent."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

from echo_bot.bus import ChannelHost

KEY_NOTE = "email-approval-key"
_CODE = re.compile(r"\b[A-Z2-7]{5}-[A-Z2-7]{5}\b")


def is_code(word: str) -> bool:
    return _CODE.fullmatch(word.upper()) is not None


class Codes:
    def __init__(self, host: ChannelHost) -> None:
        self.host = host
        self._key: bytes | None = None

    async def _secret(self) -> bytes:
        if self._key is None:
            kept = await self.host.recall_note(KEY_NOTE)
            if kept is None:  # made once: another daemon's, if it wrote first
                await self.host.remember_note(KEY_NOTE, secrets.token_hex(32), replace=False)
                kept = await self.host.recall_note(KEY_NOTE)
            assert kept is not None
            self._key = bytes.fromhex(kept[0])
        return self._key

    async def code(self, prompt_id: str, approver: str) -> str:
        message = f"{prompt_id}\n{approver.lower()}".encode()
        digest = hmac.new(await self._secret(), message, hashlib.sha256).digest()
        text = base64.b32encode(digest).decode()[:10]
        return f"{text[:5]}-{text[5:]}"

    async def given(self, prompt_id: str, approver: str, text: str) -> bool:
        """Whether ``text`` holds ``approver``'s code for ``prompt_id``."""
        wanted = await self.code(prompt_id, approver)
        return any(hmac.compare_digest(found, wanted) for found in _CODE.findall(text.upper()))
