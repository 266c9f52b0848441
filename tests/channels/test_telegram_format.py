"""Model replies shown formatted in Telegram: Markdown rendered to message entities.

The renderer's output goes through the fake Bot API's entity rules (Telegram's:
nesting, UTF-16 bounds, nothing inside code, styles never around code, no quote in a
quote), so "no parse error" is checked the way Telegram would check it.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from channels.telegram.render import MAX_TEXT
from channels.telegram.text import entity_dicts, message_parts
from echo_bot.richtext.markdown import render_markdown
from echo_bot.richtext.model import Formatted
from echo_bot.richtext.splitting import split_formatted as split
from tests.channels.test_telegram import OWNER, reply_to, say, sends, telegram_bot
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.telegram_api import check_entities, utf16_len

MODEL = "gpt-test"


def split_formatted(formatted: Formatted, limit: int = MAX_TEXT) -> list[Formatted]:
    """The splitter as Telegram's messages are cut: in UTF-16 units."""
    return split(formatted, limit, "utf16")


def entity_types(text: str) -> dict[str, str]:
    """{entity type: the text it covers} of the rendered Markdown (first of each)."""
    formatted = render_markdown(text)
    units = formatted.text.encode("utf-16-le")
    found: dict[str, str] = {}
    for entity in entity_dicts(formatted):
        start, end = 2 * entity["offset"], 2 * (entity["offset"] + entity["length"])
        found.setdefault(entity["type"], units[start:end].decode("utf-16-le"))
    check_entities(formatted.text, entity_dicts(formatted))
    return found


def test_markdown_becomes_entities_over_plain_text() -> None:
    source = (
        "# Plan\n\n**bold** _it_ `x = 1` ~~old~~ [docs](https://example.org/a)\n\n"
        "- one\n- two\n\n> quoted\n\n```python\nprint('hi')\n```"
    )
    found = entity_types(source)
    assert found == {
        "bold": "Plan",
        "italic": "it",
        "code": "x = 1",
        "strikethrough": "old",
        "text_link": "docs",
        "blockquote": "quoted",
        "pre": "print('hi')",
    }
    text = render_markdown(source).text
    assert "**" not in text and "```" not in text and "• one\n• two" in text
    pre = next(e for e in entity_dicts(render_markdown(source)) if e["type"] == "pre")
    assert pre["language"] == "python"


def test_offsets_count_utf16_units_like_telegram() -> None:
    formatted = render_markdown("😀 **b😀ld** `c😀de`")
    assert formatted.text == "😀 b😀ld c😀de"
    bold, code = entity_dicts(formatted)
    assert (bold["offset"], bold["length"]) == (3, 5)
    assert (code["offset"], code["length"]) == (9, 5)
    check_entities(formatted.text, entity_dicts(formatted))


def test_code_inside_bold_and_links_is_kept_legal() -> None:
    # Telegram refuses a style around code and code inside a link: the style is cut
    # around the code; the code inside a link loses its entity.
    formatted = render_markdown("**see `cfg` now** and [`run`](https://x.org)")
    check_entities(formatted.text, entity_dicts(formatted))
    types = [e["type"] for e in entity_dicts(formatted)]
    assert types.count("bold") == 2 and types.count("code") == 1 and "text_link" in types


def test_links_telegram_would_refuse_are_shown_as_text() -> None:
    formatted = render_markdown("[local](/etc/passwd) and [js](javascript:alert(1))")
    assert all(e["type"] != "text_link" for e in entity_dicts(formatted))
    assert "(/etc/passwd)" in formatted.text and "javascript:alert(1)" in formatted.text


HOSTILE = [
    "*unbalanced **bold and _italic",
    "```\nouter\n```inner```\n```",
    "````\n```python\nnested fence\n```\n````",
    "> > > deep quote **x",
    "[unclosed](https://x.org",
    "<b>html</b> <script>alert(1)</script> &amp;",
    "`" * 7 + "x" + "`" * 3,
    "\u202eright-to-left **bold** \u200b",
    "**" * 500,
    "- " * 300,
    "",
    "   ",
]


def test_hostile_markdown_renders_to_entities_telegram_accepts() -> None:
    for source in HOSTILE:
        for part in message_parts(source, markdown=True):
            assert part.text.strip(), source
            assert utf16_len(part.text) <= 4096
            check_entities(part.text, entity_dicts(part))


def test_a_5000_character_code_block_is_split_into_two_code_blocks() -> None:
    body = "\n".join(f"line {i:04d} " + "x" * 40 for i in range(110))  # ~5,500 chars
    parts = message_parts(f"Here:\n\n```python\n{body}\n```\nDone.", markdown=True)
    assert len(parts) == 2
    shown = ""
    for part in parts:
        check_entities(part.text, entity_dicts(part))
        assert utf16_len(part.text) <= 4096
        assert any(e["type"] == "pre" for e in entity_dicts(part))
        shown += part.text + "\n"
    for i in range(110):  # nothing lost at the cut
        assert f"line {i:04d} " in shown


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [*list("*_`~[]()>#-+!|\\ \n\tab😀é1."), "```", "**", "\n\n", "](https://x.org)"]
        ),
        max_size=200,
    ).map("".join)
)
def test_any_markdown_gives_legal_entities(source: str) -> None:
    for part in split_formatted(render_markdown(source), limit=120):
        assert utf16_len(part.text) <= 120
        check_entities(part.text, entity_dicts(part))


def llm_extra(llm: FakeOpenAI) -> str:
    return (
        f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "{MODEL}"\ntimeout = "5s"\n'
        'max_retries = 0\n[brain]\nkind = "openai"\n'
    )


async def test_a_model_reply_arrives_formatted_without_parse_mode(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply("Use **`echo-bot doctor`** first, then read [the docs](https://example.org).")
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            message_id = say(api, "how do I check my setup?")
            call = await reply_to(api, message_id, "echo-bot doctor")
            assert not call.params.get("parse_mode")
            stored = api.message(OWNER, int(call.response["result"]["message_id"]))  # type: ignore[index]
            assert stored is not None
            assert stored["plain_text"] == "Use echo-bot doctor first, then read the docs."
            types = sorted(e["type"] for e in stored["entities"])
            assert types == ["code", "text_link"]


async def test_hostile_model_markdown_is_delivered_whole(state_dir: Path) -> None:
    code = "\n".join("x" * 49 for _ in range(100))  # 5,000 characters
    reply = f"*unbalanced and ``` a fence\n\n```sh\n{code}\n```\n\n**end"
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply(reply)
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            message_id = say(api, "dump it")
            await reply_to(api, message_id, "unbalanced")
            await api.wait_for_call("sendMessage", lambda c: c.ok and "**end" in c.params["text"])
            sent = [c for c in sends(api, OWNER, ok=False) if "x" * 49 in c.params["text"]]
            assert all(c.ok for c in sends(api, OWNER, ok=False))  # nothing refused
            assert sum(c.params["text"].count("x" * 49) for c in sent) == 100


async def test_entities_telegram_refuses_fall_back_to_plain_text(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply("**bold** answer")
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            api.fail_next(
                "sendMessage", status=400, description="Bad Request: can't parse entities: x"
            )
            message_id = say(api, "hello")
            call = await reply_to(api, message_id, "bold answer")
            assert call.ok and not call.params.get("entities")
            refused = [c for c in api.calls_of("sendMessage") if not c.ok]
            assert len(refused) == 1 and refused[0].params.get("entities")
