"""What ``echo-bot doctor`` checks of Telegram: whose the token is (``getMe``) and, in
webhook mode, what Telegram says of its deliveries (``getWebhookInfo``). Read only,
bounded requests (``echo_bot.probe``); the URL holds the token, so only ``api_base`` is
ever shown."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from echo_bot.bus import DIAGNOSIS_FAIL, DIAGNOSIS_OK, DIAGNOSIS_WARN, Diagnosis
from echo_bot.probe import Probe, Unreachable

from .settings import TelegramConfig, looks_like_bot_token

ERROR_RECENT = 3600.0  # seconds: an older delivery error is history, not the state now


async def diagnose(
    section: TelegramConfig, environ: Mapping[str, str], state_dir: Path
) -> list[Diagnosis]:
    api_base = section.api_base.rstrip("/")
    token = environ.get(section.token_env, "")
    status, text = await _get_me(api_base, token, section.token_env)
    found = [Diagnosis("telegram", status, text)]
    if status == DIAGNOSIS_OK and section.mode == "webhook":
        found.append(Diagnosis("telegram webhook", *await _webhook(api_base, token, section)))
    return found


async def _webhook(api_base: str, token: str, section: TelegramConfig) -> tuple[str, str]:
    """What Telegram says of its deliveries to the webhook (getWebhookInfo): a wrong
    URL, or the error of its last try (a certificate, a proxy, a closed port), is why a
    bot in webhook mode hears nothing, and is said nowhere else."""
    try:
        async with Probe() as probe:
            answer = await probe.ask(
                "GET", f"{api_base}/bot{token}/getWebhookInfo", hide=[token]
            )  # fmt: skip
    except Unreachable as exc:
        return DIAGNOSIS_WARN, f"getWebhookInfo not answered: {exc}"
    info = answer.fields.get("result")
    if answer.status != 200 or not isinstance(info, dict):
        return DIAGNOSIS_WARN, f"getWebhookInfo answered HTTP {answer.status}"
    url, waiting = str(info.get("url") or ""), info.get("pending_update_count") or 0
    error, at = info.get("last_error_message"), info.get("last_error_date")
    if not url:
        return DIAGNOSIS_WARN, (
            f"no webhook registered with Telegram: the daemon registers {section.webhook_url}"
            " at its start (is it running?)"
        )
    if url != section.webhook_url:
        return DIAGNOSIS_WARN, (
            f"Telegram delivers to {url}, not to {section.webhook_url} (another daemon, or"
            " one with an older config, registered it)"
        )
    if isinstance(error, str) and isinstance(at, int) and time.time() - at < ERROR_RECENT:
        ago = max(0, int(time.time() - at)) // 60
        return DIAGNOSIS_FAIL, (
            f"Telegram's last delivery to {url} failed {ago} min ago: {error[:200]}"
            f" ({waiting} update(s) waiting); is it reachable over HTTPS from the internet?"
        )
    return DIAGNOSIS_OK, f"Telegram delivers to {url} ({waiting} update(s) waiting)"


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
