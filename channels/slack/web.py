"""The Web API: slack-sdk's ``AsyncWebClient`` at ``[slack] api_base``, every call paced
by Slack's limits and its errors mapped onto the delivery worker's.

Slack's limits (https://docs.slack.dev/apis/web-api/rate-limits): posting is about one
message a second per conversation, short bursts allowed; other methods by tier per
workspace (``chat.update`` Tier 3, 50+ a minute; files Tier 4), each a budget of the
host's pacer (``echo_bot.pacing``). A 429 still possible (another app of the workspace,
a server that counts differently) holds that method (and conversation) for its
``Retry-After``: a short wait is waited out here and the call made again, a long one goes
back to the delivery worker as ``ChannelError(retry_after=…)``.

The SDK's own retry handlers are off (``retry_handlers=[]``): a retried post it cannot
tell was delivered would be sent twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import ClientError, ClientSession, ClientTimeout
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from echo_bot.bus import ChannelLink
from echo_bot.errors import ChannelError
from echo_bot.pacing import Pacer, Rate
from echo_bot.rate_limits import RateLimited, within_limits

T = TypeVar("T")

REQUEST_TIMEOUT = 30  # seconds for one Web API call
RETRIES = 3
RETRY_WAIT_MAX = 10.0  # seconds; a longer Retry-After goes back to the delivery worker
# Per method: (calls a second, burst) — posting per conversation, the rest per workspace.
POST_RATE = (1.0, 3.0)
TIER_RATES = {
    "chat.update": (50 / 60, 10.0),
    "chat.delete": (50 / 60, 10.0),
    "files.getUploadURLExternal": (100 / 60, 20.0),
    "files.completeUploadExternal": (100 / 60, 20.0),
    "users.info": (100 / 60, 20.0),
}
POSTING = frozenset({"chat.postMessage", "chat.postEphemeral"})
# Errors no second try mends (the request, the token or the conversation is wrong).
FINAL = frozenset(
    {
        "invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired",
        "missing_scope", "channel_not_found", "not_in_channel", "is_archived",
        "msg_too_long", "no_text", "invalid_blocks", "invalid_arguments", "too_many_attachments",
        "message_not_found", "cant_update_message", "edit_window_closed", "restricted_action",
        "file_not_found", "user_not_found", "invalid_blocks_format", "ekm_access_denied",
    }
)  # fmt: skip
AUTH_ERRORS = frozenset({"invalid_auth", "not_authed", "account_inactive", "token_revoked"})


def rate_of(key: str) -> Rate:
    """A key's budget: posting per conversation (``method:channel``), the rest per
    workspace (``method``)."""
    method = key.partition(":")[0]
    return POST_RATE if method in POSTING else TIER_RATES.get(method, (20.0, 20.0))


def paced_as(method: str, channel: str | None) -> str:
    return f"{method}:{channel or ''}" if method in POSTING else method


class Web:
    """The bot token's client; one aiohttp session for its life (``open`` … ``close``)."""

    def __init__(self, token: str, api_base: str, link: ChannelLink) -> None:
        self.token, self.api_base = token, api_base
        self.link = link
        self.pacer = Pacer(rate_of)
        self._session: ClientSession | None = None
        self.client = AsyncWebClient(
            token=token, base_url=api_base, timeout=REQUEST_TIMEOUT, retry_handlers=[]
        )

    async def open(self) -> None:
        # The SDK applies its own timeout only to sessions it makes: this one has its own.
        self._session = ClientSession(timeout=ClientTimeout(total=REQUEST_TIMEOUT))
        self.client.session = self._session

    async def call(
        self,
        method: str,
        request: Callable[[], Awaitable[T]],
        *,
        channel: str | None = None,
        retries: int = RETRIES,
        paced: bool = True,
    ) -> T:
        """``request()`` (one SDK call of ``method``), paced (``paced=False``: its call was
        counted already, by the pacer's ``spare``); a short 429 waited out, up to ``retries``
        times."""

        key = paced_as(method, channel)

        async def once(tried: int) -> T:
            wait = self.pacer.reserve(key) if paced or tried else 0.0
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                answer = await request()
            except SlackApiError as exc:
                error, status, retry_after = _error_of(exc)
                if status == 429 or error == "ratelimited":
                    raise RateLimited(retry_after) from None
                if error in AUTH_ERRORS:
                    self.link.refused(f"Slack refused the bot token ({error})")
                if status >= 500:
                    self.link.reconnecting(
                        f"Slack failed on its side ({status} to {method})", "web"
                    )
                else:
                    self.link.back("web")
                retryable = status >= 500 or error not in FINAL
                raise ChannelError(f"{method}: {error}", retryable=retryable) from None
            except (ClientError, OSError, TimeoutError, SlackClientError) as exc:
                self.link.reconnecting(f"cannot reach {self.api_base}: {exc}", "web")
                raise ChannelError(f"{method}: network error: {exc}") from None
            self.link.back("web")
            return answer

        return await within_limits(
            once, link=self.link, what=f"slack: {method}", retries=retries,
            wait_max=RETRY_WAIT_MAX, held=lambda wait: self.pacer.hold(key, wait),
        )  # fmt: skip

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _error_of(exc: SlackApiError) -> tuple[str, int, float]:
    """(Slack's error code, the HTTP status, the Retry-After in seconds) of a refusal."""
    response: Any = exc.response
    data = response.data if isinstance(getattr(response, "data", None), dict) else {}
    error = str(data.get("error") or "unknown_error")
    status = int(getattr(response, "status_code", 0) or 0)
    headers = getattr(response, "headers", None) or {}
    raw = headers.get("Retry-After") or headers.get("retry-after") or "1"
    try:
        retry_after = max(float(raw), 1.0)
    except (TypeError, ValueError):
        retry_after = 1.0
    return error, status, retry_after
