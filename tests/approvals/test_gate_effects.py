"""The gate's rules are about effects (the second adversarial round, findings 1 and 2).

Each attack runs through a running daemon: the real aiogram client against the fake Bot
API, the real openai SDK against the scripted fake model, a real stdio MCP server. The
owner (42) approves; 77 and 88 are allowed to chat and approve nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from echo_bot.events import DecisionVerb, approval_action
from tests.channels.test_telegram import (
    OWNER,
    action,
    answer_of,
    keyboard,
    press,
    prompt_in,
    reply_to,
    say,
    sent_id,
    telegram_bot,
    text_of,
)
from tests.channels.test_telegram_media import llm_extra
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.mcp.test_mcp import mcp_state, stdio_config
from tests.tools.test_send_file import uploaded
from tests.waiting import eventually

FRIEND, OTHER = 77, 88
TEAM = (OWNER, FRIEND, OTHER)
APPROVERS = f"approvers = [{OWNER}]"


def extra(llm: FakeOpenAI, more: str = "") -> str:
    return llm_extra(llm) + f'[approvals]\ndefault_chat = "telegram:{OWNER}"\n{more}'


def workspace(state_dir: Path) -> Path:
    path = state_dir / "workspace"
    path.mkdir(parents=True, exist_ok=True)
    return path


def labels(call: Any) -> list[str]:
    return [label for label, _data in keyboard(call)]


def documents_to(api: FakeTelegramAPI, chat_id: int) -> list[Any]:
    return [c for c in api.calls_of("sendDocument") if int(c.params["chat_id"]) == chat_id]


def texts_to(api: FakeTelegramAPI, chat_id: int, contains: str) -> list[Any]:
    return [
        c
        for c in api.calls_of("sendMessage")
        if int(c.params["chat_id"]) == chat_id and contains in text_of(c)
    ]


async def grants(bot: Any) -> list[tuple[Any, ...]]:
    stored = await bot.store.run(lambda tx: tx.grants.all())
    return [(g.session_key, g.tool, g.scope) for g in stored]


SENDS = {
    "send_file": lambda to, name: {"path": name, "to": to},
    "send_message": lambda to, name: {"text": f"the contents of {name}", "to": to},
}


def delivered(api: FakeTelegramAPI, tool: str, chat_id: int) -> list[Any]:
    if tool == "send_file":
        return documents_to(api, chat_id)
    return texts_to(api, chat_id, "the contents of")


@pytest.mark.parametrize("tool", list(SENDS))
async def test_attack_allow_for_on_one_recipient_never_sends_to_another(
    state_dir: Path, tool: str
) -> None:
    """Finding 1: "Allow here for 1 h" on a call to 77 let the same tool send any file
    to 88 unasked. A call that leaves the chat asks because of what it does: it is
    never offered a grant, a forged one is refused, and none covers the next call."""
    root = workspace(state_dir)
    (root / "report.txt").write_text("quarterly numbers\n")
    (root / "private.txt").write_text("the owner's diary\n")
    async with FakeOpenAI(model="gpt-test") as llm:
        llm.tool_calls([(tool, SENDS[tool](f"telegram:{FRIEND}", "report.txt"))])
        llm.reply("Sent the report.")
        llm.tool_calls([(tool, SENDS[tool](f"telegram:{OTHER}", "private.txt"))])
        llm.reply("That was denied.")
        async with telegram_bot(state_dir, extra(llm), allowed=TEAM, telegram=APPROVERS) as (
            bot,
            api,
        ):
            first = say(api, "send the report to 77")
            prompt = await prompt_in(api)
            assert labels(prompt) == ["Approve once", "Deny"]
            request_id = action(prompt, "deny").split(":")[1]
            forged = approval_action(DecisionVerb.ALLOW_FOR, request_id, 3600)
            answer = await answer_of(api, press(api, forged, sent_id(prompt)))
            assert "requester's own chat" in answer
            assert await grants(bot) == []
            press(api, action(prompt, "approve_once"), sent_id(prompt))
            await reply_to(api, first, "Sent the report.")
            assert len(delivered(api, tool, FRIEND)) == 1

            second = say(api, "and the private one to 88")
            later = await prompt_in(api, after=len(api.calls))
            assert "private.txt" in text_of(later) and f"telegram:{OTHER}" in text_of(later)
            assert delivered(api, tool, OTHER) == []
            press(api, action(later, "deny"), sent_id(later))
            await reply_to(api, second, "That was denied.")
            assert delivered(api, tool, OTHER) == []


async def test_attack_a_non_approver_never_gets_the_owners_files_unasked(state_dir: Path) -> None:
    """Finding 2: 77 (allowed, not an approver) said "send me the notes" and got the
    owner's file and the owner's upload, unasked. Handing the owner's data to someone
    who is not an approver asks the approvers; 77 still gets back the file 77 sent."""
    (workspace(state_dir) / "owner-notes.txt").write_text("the owner's notes\n")
    async with FakeOpenAI(model="gpt-test") as llm:
        llm.reply("Saved your file.")  # the owner's upload
        async with telegram_bot(state_dir, extra(llm), allowed=TEAM, telegram=APPROVERS) as (
            bot,
            api,
        ):
            upload = {**api.add_file(b"owner's upload\n", "bank.txt"), "file_name": "bank.txt"}
            mine = say(api, "", content={"document": upload})
            await reply_to(api, mine, "Saved your file.")
            (owners_upload,) = [
                p for p in (workspace(state_dir) / "inbox").rglob("*") if p.is_file()
            ]
            relative = owners_upload.relative_to(workspace(state_dir)).as_posix()
            assert relative.startswith(f"inbox/telegram-{OWNER}/")

            llm.tool_calls(
                [
                    ("send_file", {"path": "owner-notes.txt"}),
                    ("send_file", {"path": relative}),
                ]
            )
            llm.reply("The owner has to agree first.")
            asked = say(api, "send me the notes", user_id=FRIEND)
            await eventually(lambda: len(texts_to(api, FRIEND, "needs approval")) == 2)
            first = await prompt_in(api)
            second = await prompt_in(api, after=api.calls.index(first) + 1)
            shown = text_of(first) + text_of(second)
            assert "owner-notes.txt" in shown and relative in shown
            assert "hands the workspace file" in shown  # why it asks
            assert labels(first) == labels(second) == ["Approve once", "Deny"]
            assert documents_to(api, FRIEND) == []
            press(api, action(first, "deny"), sent_id(first))
            press(api, action(second, "deny"), sent_id(second))
            await reply_to(api, asked, "The owner has to agree first.", chat_id=FRIEND)
            assert documents_to(api, FRIEND) == []

            llm.reply("Saved.")
            theirs = {**api.add_file(b"77's own list\n", "list.txt"), "file_name": "list.txt"}
            sent = say(api, "", user_id=FRIEND, content={"document": theirs})
            await reply_to(api, sent, "Saved.", chat_id=FRIEND)
            (own,) = (workspace(state_dir) / "inbox" / f"telegram-{FRIEND}").rglob("*.txt")
            llm.tool_calls(
                [("send_file", {"path": own.relative_to(workspace(state_dir)).as_posix()})]
            )
            llm.reply("Here it is.")
            back = say(api, "send my list back", user_id=FRIEND)
            await reply_to(api, back, "Here it is.", chat_id=FRIEND)
            (document,) = documents_to(api, FRIEND)
            assert uploaded(document.params, "document").data == b"77's own list\n"
            assert await bot.store.run(lambda tx: tx.approvals.list()) == []  # none pending


async def test_a_grant_covers_the_directory_the_prompt_showed_and_nothing_else(
    state_dir: Path,
) -> None:
    """ "Allow here for 1 h" on a write to notes/a.txt covers writes into notes/, and the
    outcome says so; a write into another directory asks again."""
    async with FakeOpenAI(model="gpt-test") as llm:
        llm.tool_calls([("file_write", {"path": "notes/a.txt", "content": "a"})])
        llm.reply("Wrote a.")
        llm.tool_calls([("file_write", {"path": "notes/b.txt", "content": "b"})])
        llm.reply("Wrote b.")
        llm.tool_calls([("file_write", {"path": "other/c.txt", "content": "c"})])
        llm.reply("Not written.")
        async with telegram_bot(state_dir, llm_extra(llm)) as (bot, api):
            first = say(api, "write a")
            prompt = await prompt_in(api)
            assert labels(prompt) == ["Approve once", "Allow here for 1 h", "Deny"]
            press(api, action(prompt, "allow_for"), sent_id(prompt))
            await reply_to(api, first, "Wrote a.")
            assert await grants(bot) == [(f"telegram:{OWNER}", "file_write", "notes/")]
            edit = await api.wait_for_call("editMessageText", lambda c: c.ok)
            assert "for notes/ only" in text_of(edit)

            prompts = len([c for c in api.calls_of("sendMessage") if keyboard(c)])
            second = say(api, "write b")
            await reply_to(api, second, "Wrote b.")
            assert (workspace(state_dir) / "notes" / "b.txt").read_text() == "b"
            assert len([c for c in api.calls_of("sendMessage") if keyboard(c)]) == prompts

            third = say(api, "write c")
            other = await prompt_in(api, after=len(api.calls))
            assert "other/c.txt" in text_of(other)
            press(api, action(other, "deny"), sent_id(other))
            await reply_to(api, third, "Not written.")
            assert not (workspace(state_dir) / "other").exists()


async def test_attack_a_file_swapped_for_a_link_after_the_check_is_not_sent(
    state_dir: Path,
) -> None:
    """A call that runs unasked is judged again right before it runs: 77's own upload
    replaced by a link to the owner's file between the check and the run is not sent.
    (The swap is done here while the turn waits on an unrelated approval in the same
    step, the widest window between the two.)"""
    root = workspace(state_dir)
    (root / "owner-notes.txt").write_text("the owner's notes\n")
    own = root / "inbox" / f"telegram-{FRIEND}" / "2026-12-03" / "abcd1234-1-list.txt"
    own.parent.mkdir(parents=True)
    own.write_text("77's list\n")
    relative = own.relative_to(root).as_posix()
    async with FakeOpenAI(model="gpt-test") as llm:
        llm.tool_calls(
            [
                ("file_write", {"path": "todo.txt", "content": "x"}),  # asks the owner
                ("send_file", {"path": relative}),  # 77's own file: settled unasked
            ]
        )
        llm.reply("Done.")
        async with telegram_bot(state_dir, extra(llm), allowed=TEAM, telegram=APPROVERS) as (
            _bot,
            api,
        ):
            asked = say(api, "save a todo and send my list", user_id=FRIEND)
            prompt = await prompt_in(api)
            own.unlink()
            own.symlink_to(root / "owner-notes.txt")
            press(api, action(prompt, "approve_once"), sent_id(prompt))
            await reply_to(api, asked, "Done.", chat_id=FRIEND)
            assert documents_to(api, FRIEND) == []
            request = llm.chat_requests()[-1]
            results = [m["content"] for m in request["messages"] if m["role"] == "tool"]
            assert any("changed since it was checked" in str(r) for r in results), results


async def test_attack_an_mcp_read_of_the_owners_notes_asks_for_a_non_approver(
    state_dir: Path,
) -> None:
    """What an MCP server answers may be the owner's data: its read tools run unasked
    for the owner, and ask the approvers when someone else's turn calls them."""
    notes = state_dir / "notes"
    notes.mkdir()
    async with FakeOpenAI(model="gpt-test") as llm:
        llm.tool_calls([("notes__list_notes", {})])
        llm.reply("Here are your notes.")
        llm.tool_calls([("notes__list_notes", {})])
        llm.reply("The owner said no.")
        config = extra(llm) + stdio_config(notes, "trust_annotations = true")
        async with telegram_bot(state_dir, config, allowed=TEAM, telegram=APPROVERS) as (
            bot,
            api,
        ):
            await eventually(lambda: mcp_state(bot)["notes"]["state"] == "ready")
            mine = say(api, "list my notes")
            await reply_to(api, mine, "Here are your notes.")
            assert not [c for c in api.calls_of("sendMessage") if keyboard(c)]

            theirs = say(api, "list the owner's notes", user_id=FRIEND)
            prompt = await prompt_in(api)
            assert "notes__list_notes" in text_of(prompt)
            assert "what the MCP server notes answers" in text_of(prompt)
            press(api, action(prompt, "deny"), sent_id(prompt))
            await reply_to(api, theirs, "The owner said no.", chat_id=FRIEND)
            results = [m for m in llm.chat_requests()[-1]["messages"] if m["role"] == "tool"]
            assert "APPROVAL_DENIED" in str(results[-1]["content"])


async def test_attack_the_owners_request_in_a_group_never_shows_a_file_to_the_group_unasked(
    state_dir: Path,
) -> None:
    """Review of this round: in a group every member reads what the bot sends. A
    member's message primes the shared history; the owner's next turn calls send_file
    there — it asks, in the group, and offers no grant; nothing is sent before."""
    (workspace(state_dir) / "passwords.txt").write_text("hunter2\n")
    group = -100123
    async with FakeOpenAI(model="gpt-test") as llm:
        llm.tool_calls([("send_file", {"path": "passwords.txt"})])
        llm.reply("Not sent.")
        async with telegram_bot(state_dir, extra(llm), allowed=TEAM, telegram=APPROVERS) as (
            _bot,
            api,
        ):
            say(api, "@echo_test_bot what is new?", chat_type="group", chat_id=group)
            prompt = await prompt_in(api, group)
            assert "passwords.txt" in text_of(prompt)
            assert labels(prompt) == ["Approve once", "Deny"]
            assert documents_to(api, group) == []
            press(api, action(prompt, "deny"), sent_id(prompt), chat_id=group)
            # In a group the reply grows in one message by edits.
            await eventually(
                lambda: any(
                    "Not sent." in text_of(c)
                    for c in api.calls
                    if c.method in ("sendMessage", "editMessageText") and c.ok
                )
            )
            assert documents_to(api, group) == []


ALLOW_CAT = 'allow_commands = ["cat *"]\n'  # into the [tools.shell] table telegram_bot opens


async def test_attack_an_allowlisted_command_hands_a_non_approver_nothing_of_the_owners_unasked(
    state_dir: Path,
) -> None:
    """`cat *` is allowlisted for the owner's own use: asked by 77, its output (the
    owner's file) would go to 77, so the approvers are asked first; the owner's own
    request in their direct chat runs unasked, as the allowlist says."""
    (workspace(state_dir) / "owner-notes.txt").write_text("the owner's diary\n")
    async with FakeOpenAI(model="gpt-test") as llm:
        llm.tool_calls([("shell_exec", {"argv": ["cat", "owner-notes.txt"]})])
        llm.reply("The owner has to agree first.")
        llm.tool_calls([("shell_exec", {"argv": ["cat", "owner-notes.txt"]})])
        llm.reply("Here it is.")
        config = ALLOW_CAT + extra(llm)
        async with telegram_bot(state_dir, config, allowed=TEAM, telegram=APPROVERS) as (
            _bot,
            api,
        ):
            asked = say(api, "show me the notes", user_id=FRIEND)
            prompt = await prompt_in(api)
            assert int(prompt.params["chat_id"]) == OWNER  # to the approvers
            assert 'argv=["cat","owner-notes.txt"]' in text_of(prompt)
            press(api, action(prompt, "deny"), sent_id(prompt))
            await reply_to(api, asked, "The owner has to agree first.", chat_id=FRIEND)
            mine = say(api, "show me my notes")
            await reply_to(api, mine, "Here it is.")
            assert len(api.calls_of("sendMessage")) > 0
        # The model saw the file's text once: the owner's call ran, 77's did not.
        seen = [r.json for r in llm.requests if "the owner's diary" in str(r.json)]
        assert len(seen) == 1
