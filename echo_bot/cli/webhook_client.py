"""Signing and posting a test delivery (``echo-bot webhook send``)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time


def sign_headers(auth: str, secret: str, body: bytes, event: str | None = None) -> dict[str, str]:
    """The headers a real sender would add for ``auth``."""
    headers = {"Content-Type": "application/json"}
    if auth == "github":
        digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        headers["X-Hub-Signature-256"] = f"sha256={digest}"
        headers["X-GitHub-Event"] = event or "push"
        headers["X-GitHub-Delivery"] = secrets.token_hex(16)
    elif auth == "standard":
        msg_id, stamp = f"msg_{secrets.token_hex(12)}", str(int(time.time()))
        raw = secret.removeprefix("whsec_")
        try:  # padding is optional, as in the reference library
            key = base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
        except ValueError:
            key = secret.encode()
        signed = f"{msg_id}.{stamp}.".encode() + body
        signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
        headers.update(
            {
                "webhook-id": msg_id,
                "webhook-timestamp": stamp,
                "webhook-signature": f"v1,{signature}",
            }
        )
    elif auth == "bearer":
        headers["Authorization"] = f"Bearer {secret}"
    return headers


async def post_signed(
    url: str, auth: str, secret: str, body: bytes, event: str | None = None
) -> tuple[int, str]:
    """The daemon's answer; ``ConnectionError`` when there is none (refused, cut off, not
    HTTP, too slow)."""
    from aiohttp import ClientError, ClientSession, ClientTimeout

    try:
        async with (
            ClientSession(timeout=ClientTimeout(total=15)) as session,
            session.post(url, data=body, headers=sign_headers(auth, secret, body, event)) as answer,
        ):
            return answer.status, await answer.text()
    except (ClientError, TimeoutError) as exc:  # aiohttp's own are no OSError
        raise ConnectionError(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
