"""What ``echo-bot doctor`` checks of Slack: the bot token (``auth.test``: whose, and
the scopes Slack lists for it against those the channel uses), and the transport's
secret (Socket Mode: the app token opens a connection URL, which is left unused; HTTP:
the signing secret is set — only Slack's own requests can prove it right).

Read only, every request bounded (``echo_bot.probe``); the tokens go in headers only,
never into what is printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from echo_bot.bus import DIAGNOSIS_FAIL, DIAGNOSIS_OK, DIAGNOSIS_WARN, Diagnosis
from echo_bot.errors import EchoBotError
from echo_bot.probe import Probe, Unreachable

from .settings import SlackConfig

# The scopes the channel uses: to read and answer direct messages and mentions, post and
# update messages; files both ways when [slack] media is on.
NEEDED = ("chat:write", "im:history", "app_mentions:read")
FOR_FILES = ("files:read", "files:write")
REFUSED = frozenset({"invalid_auth", "not_authed", "token_revoked", "account_inactive"})


async def diagnose(
    section: SlackConfig, environ: Mapping[str, str], state_dir: Path
) -> list[Diagnosis]:
    found = [await _bot_token(section, environ)]
    if section.mode == "socket":
        if found[0].name == REACH:  # asked again, it would not answer again
            found.append(_app_token_set(section, environ))
        else:
            found.append(await _app_token(section, environ))
    else:
        name = section.signing_secret_env
        if environ.get(name):
            text = f"${name} is set (Slack's signed requests to {section.path} prove it right)"
            found.append(Diagnosis("slack signing secret", DIAGNOSIS_OK, text))
        else:
            found.append(Diagnosis("slack signing secret", DIAGNOSIS_FAIL, f"${name} is not set"))
    return found


REACH = "slack api"  # the check's name when Slack did not answer (not the token's fault)


class _Refused(EchoBotError):
    """Slack answered the call with an error (its code)."""


async def _call(
    section: SlackConfig, token: str, method: str
) -> tuple[dict[str, object], Mapping[str, str]]:
    """One Web API method with ``token``: its answer and headers. Raises ``_Refused``,
    or ``Unreachable`` for the network, the time, or Slack's side (429, 5xx)."""
    async with Probe() as probe:
        answer = await probe.ask("POST", f"{section.api_base.rstrip('/')}/{method}", token=token)
    if answer.status == 429 or answer.status >= 500:
        raise Unreachable(f"HTTP {answer.status}")
    if not answer.fields.get("ok"):
        raise _Refused(str(answer.fields.get("error") or f"HTTP {answer.status}"))
    return answer.fields, answer.headers


def _cannot_reach(section: SlackConfig, method: str, exc: Unreachable) -> Diagnosis:
    text = (
        f"cannot reach {section.api_base} ({method}: {exc}); `echo-bot run` keeps trying"
        " until Slack answers"
    )
    return Diagnosis(REACH, DIAGNOSIS_FAIL, text)


async def _bot_token(section: SlackConfig, environ: Mapping[str, str]) -> Diagnosis:
    name = "slack bot token"
    token = environ.get(section.bot_token_env, "")
    if not token:
        return Diagnosis(name, DIAGNOSIS_FAIL, f"${section.bot_token_env} is not set")
    try:
        data, headers = await _call(section, token, "auth.test")
    except Unreachable as exc:
        return _cannot_reach(section, "auth.test", exc)
    except _Refused as exc:
        why = str(exc)
        if why in REFUSED:
            text = (
                f"Slack refused ${section.bot_token_env} ({why}): copy the app's Bot User"
                " OAuth Token again (OAuth & Permissions), or reinstall the app"
            )
        else:
            text = f"Slack refused ${section.bot_token_env} (auth.test: {why})"
        return Diagnosis(name, DIAGNOSIS_FAIL, text)
    who = f"{data.get('user', '?')} ({data.get('user_id', '?')}) in {data.get('team', '?')}"
    scopes = {s.strip() for s in headers.get("x-oauth-scopes", "").split(",") if s.strip()}
    wanted = NEEDED + (FOR_FILES if section.media else ())
    missing = [s for s in wanted if s not in scopes]
    if not scopes:
        return Diagnosis(name, DIAGNOSIS_WARN, f"the bot is {who}; Slack listed no scopes")
    if missing:
        text = (
            f"the bot is {who}, but its token lacks {', '.join(missing)}: add them under OAuth"
            " & Permissions and reinstall the app"
        )
        return Diagnosis(name, DIAGNOSIS_FAIL, text)
    return Diagnosis(name, DIAGNOSIS_OK, f"the bot is {who}; scopes {', '.join(wanted)} granted")


async def _app_token(section: SlackConfig, environ: Mapping[str, str]) -> Diagnosis:
    name = "slack app token"
    token = environ.get(section.app_token_env, "")
    if not token:
        return Diagnosis(name, DIAGNOSIS_FAIL, f"${section.app_token_env} is not set (Socket Mode)")
    try:
        await _call(section, token, "apps.connections.open")
    except Unreachable as exc:
        return _cannot_reach(section, "apps.connections.open", exc)
    except _Refused as exc:
        text = (
            f"Slack refused ${section.app_token_env} for Socket Mode ({exc}): an"
            " app-level token with connections:write, and Socket Mode on for the app"
        )
        return Diagnosis(name, DIAGNOSIS_FAIL, text)
    return Diagnosis(name, DIAGNOSIS_OK, f"${section.app_token_env} opens Socket Mode")


def _app_token_set(section: SlackConfig, environ: Mapping[str, str]) -> Diagnosis:
    """The app token when Slack cannot be asked: set, at least."""
    name = "slack app token"
    if not environ.get(section.app_token_env, ""):
        return Diagnosis(name, DIAGNOSIS_FAIL, f"${section.app_token_env} is not set (Socket Mode)")
    text = f"${section.app_token_env} is set (not checked: Slack did not answer)"
    return Diagnosis(name, DIAGNOSIS_WARN, text)
