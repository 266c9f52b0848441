"""What ``echo-bot doctor`` checks of Telegram: whose the token is (``getMe``). Read
only, one bounded request (``echo_bot.probe``); the URL holds the token, so only
``api_base`` is ever shown."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from echo_bot.bus import DIAGNOSIS_FAIL, DIAGNOSIS_OK, DIAGNOSIS_WARN, Diagnosis
from echo_bot.probe import Probe, Unreachable

from .settings import TelegramConfig, looks_like_bot_token


async def diagnose(
    section: TelegramConfig, environ: Mapping[str, str], state_dir: Path
) -> list[Diagnosis]:
    api_base = section.api_base.rstrip("/")
    status, text = await _get_me(api_base, environ.get(section.token_env, ""), section.token_env)
    return [Diagnosis("telegram", status, text)]


async def _get_me(api_base: str, token: str, token_env: str) -> tuple[str, str]:
    """Ask the Bot API who the token belongs to: an unknown token is 401 (404 when it is
    malformed)."""
    if not token:
        return DIAGNOSIS_WARN, f"not asked: ${token_env} is not set"
    if not looks_like_bot_token(token):  # said by the config check: never sent anywhere
        return DIAGNOSIS_FAIL, f"not asked: ${token_env} does not look like a bot token"
    try:
        async with Probe() as probe:
            answer = await probe.ask("GET", f"{api_base}/bot{token}/getMe", hide=[token])
    except Unreachable as exc:
        return DIAGNOSIS_FAIL, f"cannot reach {api_base}: {exc}"
    status = answer.status
    if status in (401, 404):
        return DIAGNOSIS_FAIL, (
            f"the Bot API at {api_base} rejected the token (getMe: HTTP {status}): check"
            f" {token_env} / BotFather"
        )
    if status == 200 and answer.fields.get("ok"):
        bot = answer.fields.get("result") or {}
        return DIAGNOSIS_OK, f"{api_base} knows the token: the bot is @{bot.get('username', '?')}"
    if status == 429 or status >= 500:
        return DIAGNOSIS_WARN, f"{api_base} answered getMe with HTTP {status}; try again later"
    return DIAGNOSIS_FAIL, f"{api_base} answered getMe with HTTP {status}: is it a Bot API server?"
