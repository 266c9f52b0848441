"""The offline rules brain: tool-card triggers, tool results, odd input; and the commands
as a turn meets them (the command registry first, then the brain)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import pytest

from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.brains.rules import NO_MATCH_HINT, RulesBrain, match_tool
from echo_bot.commands.core import register_core_commands
from echo_bot.commands.registry import CommandRegistry
from echo_bot.conversation import ChatMessage
from echo_bot.events import Address, Sender
from echo_bot.tools.base import Risk, Tool, ToolContext, ToolResult
from echo_bot.tools.builtin import CurrentTimeTool


class EchoTool(Tool):
    name: ClassVar[str] = "echo_text"
    description: ClassVar[str] = "Repeat a text."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    }
    risk: ClassVar[Risk] = Risk.READ
    triggers: ClassVar[tuple[str, ...]] = ("say back",)

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.success(args["text"])


async def no_pending() -> list[Any]:
    return []


@pytest.fixture
def brain() -> RulesBrain:
    commands = CommandRegistry()
    register_core_commands(commands, no_pending)
    return RulesBrain(commands)


@pytest.fixture
def tools() -> list[Tool]:
    return [CurrentTimeTool("UTC"), EchoTool()]


CONTEXT = BrainContext(
    trace_id="t",
    session_key="cli:local",
    origin=Address(channel="cli", chat_id="local"),
    sender=Sender(id="owner"),
    step=1,
)


async def ask(brain: RulesBrain, text: str, tools: list[Tool]) -> BrainReply:
    """``text`` answered as the turn runner answers it: a command by the registry, anything
    else by the brain."""
    reply = await brain.commands.answer(text, CONTEXT, tools) or await brain.step(
        [ChatMessage(role="user", content=text)], tools, CONTEXT
    )
    assert reply.route_reason.startswith("rules"), reply
    assert reply.text or reply.tool_calls, reply
    return reply


# --------------------------------------------------------------------------- triggers


@pytest.mark.parametrize(
    "text", ["what time is it?", "What's the time", "hey, WHAT TIME IS IT!!", "today's date pls"]
)
async def test_time_questions_call_current_time(
    brain: RulesBrain, tools: list[Tool], text: str
) -> None:
    reply = await ask(brain, text, tools)
    assert [c.name for c in reply.tool_calls] == ["current_time"]
    assert reply.tool_calls[0].args == {}
    assert reply.text is None
    assert "current_time" in reply.route_reason


async def test_time_in_a_named_zone_extracts_the_zone(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, "what time is it in europe/berlin?", tools)
    assert reply.tool_calls[0].args == {"timezone": "Europe/Berlin"}


def test_negative_trigger_blocks_a_match(tools: list[Tool]) -> None:
    assert match_tool("what time is it", tools) is not None
    assert match_tool("remind me what time is it at the bank", tools) is None


async def test_negative_trigger_gives_the_hint(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, "remind me what time it is tomorrow, what time is it", tools)
    assert reply.tool_calls == []
    assert reply.text == NO_MATCH_HINT


@pytest.mark.parametrize("text", ["hello", "Hi there!", "good morning", "hey bot"])
async def test_issue28_a_greeting_is_greeted_with_what_i_can_do(
    brain: RulesBrain, tools: list[Tool], text: str
) -> None:
    """Issue 28: offline, "hello" got "I did not understand that"."""
    reply = await ask(brain, text, tools)
    assert reply.tool_calls == [] and reply.text is not None
    assert reply.text.startswith("Hello!") and NO_MATCH_HINT not in reply.text
    assert "“what time is it”" in reply.text and "“say back”" in reply.text
    assert "/help" in reply.text and "/tools" in reply.text


@pytest.mark.parametrize("text", ["what can you do?", "Who are you", "help"])
async def test_issue28_what_can_you_do_lists_the_tools_and_commands(
    brain: RulesBrain, tools: list[Tool], text: str
) -> None:
    reply = await ask(brain, text, tools)
    assert reply.tool_calls == [] and reply.text is not None
    assert reply.text.startswith("Here is what I can do:")
    assert "Tell the current date, weekday and time — e.g. “what time is it”" in reply.text
    assert "Repeat a text — e.g. “say back”" in reply.text
    assert "Commands: /help, /tools, /approvals" in reply.text


async def test_what_i_can_do_is_only_what_is_exposed(brain: RulesBrain) -> None:
    reply = await ask(brain, "what can you do?", [EchoTool()])
    assert reply.text is not None
    assert "say back" in reply.text and "what time is it" not in reply.text


async def test_a_greeting_with_a_request_runs_the_request(
    brain: RulesBrain, tools: list[Tool]
) -> None:
    reply = await ask(brain, "hello, what time is it?", tools)
    assert [c.name for c in reply.tool_calls] == ["current_time"]
    assert (await ask(brain, "hello world", tools)).text == NO_MATCH_HINT


async def test_trigger_without_extractable_args_explains(
    brain: RulesBrain, tools: list[Tool]
) -> None:
    reply = await ask(brain, "say back please", tools)
    assert reply.tool_calls == []
    assert "echo_text" in (reply.text or "") and "/tool echo_text" in (reply.text or "")


async def test_tools_not_exposed_are_not_matched(brain: RulesBrain) -> None:
    reply = await ask(brain, "what time is it?", [])
    assert reply.tool_calls == [] and reply.text == NO_MATCH_HINT


# --------------------------------------------------------------------------- commands


async def test_unknown_command_is_helpful(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, "/frobnicate now", tools)
    assert reply.text == "Unknown command /frobnicate. Send /help for the list."
    assert "frobnicate" in reply.route_reason


async def test_on_slack_the_answers_name_commands_as_slack_people_type_them(
    brain: RulesBrain, tools: list[Tool]
) -> None:
    """Slack takes /commands as its own: its people type !help (``ChannelSpec.prefix``)."""
    on_slack = replace(CONTEXT, origin=Address(channel="slack", chat_id="D0OWNER"))
    unknown = await brain.commands.run("frobnicate", "", on_slack, tools)
    assert unknown.text == "Unknown command !frobnicate. Send !help for the list."
    listed = await brain.commands.run("help", "", on_slack, tools)
    assert "!help — show this help" in (listed.text or "") and "/help" not in (listed.text or "")
    hint = await brain.step([ChatMessage(role="user", content="zz")], tools, on_slack)
    assert hint.text == "I did not understand that. Send !help to see what I can do."


@pytest.mark.parametrize("text", ["/help", "/help@SomeBot", "/HELP", "  /help  "])
async def test_help(brain: RulesBrain, tools: list[Tool], text: str) -> None:
    reply = await ask(brain, text, tools)
    assert reply.text is not None
    for name in ("/help", "/tools", "/approvals", "/tool NAME {json}", "/run COMMAND"):
        assert name in reply.text
    assert reply.route_reason == "rules: command /help"


async def test_tools_lists_exposed_tools(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, "/tools", tools)
    assert "current_time (read)" in (reply.text or "")
    assert "echo_text" in (reply.text or "")
    none = await ask(brain, "/tools", [])
    assert none.text == "No tools are enabled."


async def test_approvals_when_none_pending(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, "/approvals", tools)
    assert reply.text == "No approvals are pending."


async def test_tool_command_calls_the_tool(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, '/tool echo_text {"text": "hi there"}', tools)
    assert [(c.name, c.args) for c in reply.tool_calls] == [("echo_text", {"text": "hi there"})]
    bare = await ask(brain, "/tool current_time", tools)
    assert [(c.name, c.args) for c in bare.tool_calls] == [("current_time", {})]


async def test_tool_command_with_bad_json_is_explained(
    brain: RulesBrain, tools: list[Tool]
) -> None:
    reply = await ask(brain, "/tool current_time {not json", tools)
    assert reply.tool_calls == []
    assert (reply.text or "").startswith("The arguments are not valid JSON")


async def test_tool_command_with_non_object_args(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, "/tool x [1,2]", tools)
    assert reply.tool_calls == []
    assert "must be a JSON object" in (reply.text or "")


async def test_tool_command_without_name_shows_usage(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, "/tool", tools)
    assert (reply.text or "").startswith("Usage: /tool NAME")


async def test_run_without_args_shows_usage(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, "/run", tools)
    assert reply.tool_calls == []
    assert (reply.text or "").startswith("Usage: /run COMMAND")


async def test_run_with_a_command_calls_shell_exec(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await ask(brain, "/run ls -la", tools)
    assert [(c.name, c.args) for c in reply.tool_calls] == [("shell_exec", {"command": "ls -la"})]
    assert reply.route_reason == "rules: command /run"


# --------------------------------------------------------------------------- results


async def test_after_one_tool_result_replies_with_its_text(
    brain: RulesBrain, tools: list[Tool]
) -> None:
    conversation = [
        ChatMessage(role="user", content="what time is it?"),
        ChatMessage(role="assistant", content=None),
        ChatMessage(role="tool", content="It is Monday.", name="current_time", tool_call_id="1"),
    ]
    reply = await brain.step(conversation, tools, CONTEXT)
    assert reply.text == "It is Monday."
    assert reply.tool_calls == []
    assert reply.route_reason == "rules: reported tool results"


async def test_after_several_tool_results_names_each(brain: RulesBrain, tools: list[Tool]) -> None:
    conversation = [
        ChatMessage(role="user", content="do two things"),
        ChatMessage(role="tool", content="first out", name="a", tool_call_id="1"),
        ChatMessage(role="tool", content="  ", name="b", tool_call_id="2"),
    ]
    reply = await brain.step(conversation, tools, CONTEXT)
    assert reply.text == "a: first out\n\nb: (no output)"


async def test_old_tool_results_do_not_answer_a_new_question(
    brain: RulesBrain, tools: list[Tool]
) -> None:
    conversation = [
        ChatMessage(role="tool", content="old", name="a", tool_call_id="1"),
        ChatMessage(role="assistant", content="old"),
        ChatMessage(role="user", content="what time is it?"),
    ]
    reply = await brain.step(conversation, tools, CONTEXT)
    assert [c.name for c in reply.tool_calls] == ["current_time"] and reply.text is None


async def test_a_command_is_not_the_brains_business(brain: RulesBrain, tools: list[Tool]) -> None:
    """The runner asks the registry first; the rules brain itself runs no command."""
    reply = await brain.step([ChatMessage(role="user", content="/approvals")], tools, CONTEXT)
    assert reply.text == NO_MATCH_HINT
    assert await brain.commands.answer("what time is it?", CONTEXT, tools) is None


# --------------------------------------------------------------------------- odd input


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n\t ",
        "/",
        "//",
        "/@",
        "@bot",
        "\x00\x01\x02",
        "\u202eevil\u202c 🙂🙃 ＷＨＡＴ ＴＩＭＥ",
        "ｗｈａｔ ｔｉｍｅ ｉｓ ｉｔ",
        "\U0010ffff \ud800",
        "مرحبا كم الساعة",
        "/" + "a" * 40,
        "/tool " + "{" * 10_000,
    ],
)
async def test_odd_input_gets_a_reply(brain: RulesBrain, tools: list[Tool], text: str) -> None:
    await ask(brain, text, tools)


async def test_huge_input_gets_a_reply(brain: RulesBrain, tools: list[Tool]) -> None:
    huge = ("lorem ipsum " * 90_000)[:1_000_000]
    reply = await ask(brain, huge, tools)
    assert reply.text == NO_MATCH_HINT
    with_trigger = await ask(brain, huge + " what time is it?", tools)
    assert [c.name for c in with_trigger.tool_calls] == ["current_time"]
    huge_command = await ask(brain, "/tool echo_text " + "x" * 1_000_000, tools)
    assert "not valid JSON" in (huge_command.text or "")


async def test_empty_conversation_gets_a_reply(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await brain.step([], tools, CONTEXT)
    assert reply.text == NO_MATCH_HINT and reply.route_reason


async def test_message_without_content_gets_a_reply(brain: RulesBrain, tools: list[Tool]) -> None:
    reply = await brain.step([ChatMessage(role="user", content=None)], tools, CONTEXT)
    assert reply.text == NO_MATCH_HINT and reply.route_reason
