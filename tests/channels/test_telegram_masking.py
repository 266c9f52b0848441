"""Secrets in what the Markdown renderer makes: masked right before the Bot API.

The delivery worker masks the Markdown source, but rendering decodes character
references, drops emphasis inside a word and backslash escapes: a secret written in
such disguises is only whole once rendered. So the rendered text (and its link URLs) is
masked too, before it is cut into messages, and the entities are moved to stay valid —
checked by the fake Bot API's entity rules, as Telegram would check them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import quote

from hypothesis import given, settings
from hypothesis import strategies as st

from channels.telegram.render import MAX_TEXT
from channels.telegram.text import entity_dicts, message_parts, preview_part
from echo_bot.brains.openai_brain import PREVIEW_EVERY
from echo_bot.richtext.markdown import render_markdown
from echo_bot.richtext.masking import masked, masked_growing
from echo_bot.richtext.model import Formatted, Span
from echo_bot.richtext.splitting import split_formatted as split
from echo_bot.secrets import Masker
from tests.channels.test_telegram import OWNER, TOKEN, say, telegram_bot
from tests.fakes.openai_api import FakeOpenAI
from tests.fakes.telegram_api import Call, FakeTelegramAPI, check_entities

MODEL = "gpt-test"


def split_formatted(formatted: Formatted, limit: int = MAX_TEXT) -> list[Formatted]:
    """The splitter as Telegram's messages are cut: in UTF-16 units."""
    return split(formatted, limit, "utf16")


SECRETS = (TOKEN, quote(TOKEN, safe=""), quote(TOKEN))  # as the masker knows it
OTHER = "s3cr3t-passphrase"


def llm_extra(llm: FakeOpenAI, openai: str = "") -> str:
    return (
        f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "{MODEL}"\ntimeout = "5s"\n'
        f'max_retries = 0\n{openai}\n[brain]\nkind = "openai"\n'
    )


def decimal(text: str) -> str:
    return "".join(f"&#{ord(c)};" for c in text)


def hexadecimal(text: str) -> str:
    return "".join(f"&#x{ord(c):x};" for c in text)


def covered(formatted: Formatted) -> list[tuple[str, str]]:
    """(type, the text it covers) of each entity, as Telegram would read it."""
    units = formatted.text.encode("utf-16-le")
    return [
        (e["type"], units[2 * e["offset"] : 2 * (e["offset"] + e["length"])].decode("utf-16-le"))
        for e in entity_dicts(formatted)
    ]


def assert_clean(formatted: Formatted, masker: Masker) -> None:
    check_entities(formatted.text, entity_dicts(formatted))
    assert masker.find(formatted.text) == []
    for span in formatted.spans:
        assert masker.mask(span.url or "") == (span.url or "")


# -- masking the rendered text: offsets ------------------------------------------------------
def test_entities_after_a_masked_secret_move_with_it_and_stay_valid() -> None:
    masker = Masker([TOKEN])
    source = f"😀 {decimal(TOKEN)} then **bold** and `code😀` and [a link](https://h/x)"
    rendered = render_markdown(source)
    assert TOKEN in rendered.text  # what the renderer made of it
    out = masked(rendered, masker)
    assert out.text == "😀 *** then bold and code😀 and a link"
    assert covered(out) == [("bold", "bold"), ("code", "code😀"), ("text_link", "a link")]
    assert_clean(out, masker)


def test_an_entity_over_part_of_a_secret_stops_at_the_mask() -> None:
    masker = Masker([TOKEN])
    head, tail = TOKEN[:4], TOKEN[4:]
    for source, expected in [
        # emphasis inside the token: the bold part is inside the secret, so it goes
        (f"x {head}**{tail[:2]}**{tail[2:]} y", []),
        # bold from before the token into it: stops where the mask begins
        (f"**x {head}**{tail} y", [("bold", "x ")]),
        # code from inside the token to after it: begins after the mask
        (f"x {head}`{tail} y` z", [("code", " y")]),
        # a link around the token wholly: it covers the mask
        (f"[a {TOKEN} b](https://h/x) c", [("text_link", "a *** b")]),
        # bold around, italic inside the token: the bold stays, around the mask
        (f"**a {head}*{tail}* b**", [("bold", "a *** b")]),
    ]:
        rendered = render_markdown(source)
        assert TOKEN in rendered.text, source
        out = masked(rendered, masker)
        assert covered(out) == expected, source
        assert_clean(out, masker)


def test_link_urls_and_code_languages_are_masked() -> None:
    masker = Masker([TOKEN, "pythonsecret"])
    source = (
        f"[x](https://h/{decimal(TOKEN)}) [y](https://h/?t={TOKEN[:6]}%3A{TOKEN[7:]})\n\n"
        "```pythonsecret\nprint()\n```"
    )
    out = masked(render_markdown(source), masker)
    links = [s.url for s in out.spans if s.type == "text_link"]
    assert links == ["https://h/***", "https://h/?t=***"]
    assert [s.language for s in out.spans if s.type == "pre"] == [None]
    assert_clean(out, masker)


def test_secrets_side_by_side_and_overlapping_are_masked_in_one_pass() -> None:
    masker = Masker(["abcdef", "defghi", OTHER])
    rendered = Formatted("xx abcdefghi **abcdefabcdef", (Span("bold", 0, 27),))
    out = masked(rendered, masker)
    assert out.text == "xx *** ********"
    assert covered(out) == [("bold", out.text)]
    assert_clean(out, masker)


def test_a_secret_across_the_cut_between_two_messages_is_masked_whole() -> None:
    masker = Masker([TOKEN])
    source = "y" * 4090 + decimal(TOKEN) + " and **more** text"
    assert message_parts(source, True)[0].text.endswith(TOKEN[:6])  # the cut is inside it
    parts = message_parts(source, True, masker)
    assert TOKEN[:6] not in "".join(p.text for p in parts) and len(parts) == 2
    for part in parts:
        assert_clean(part, masker)


def test_a_preview_holds_back_an_end_that_could_begin_a_secret() -> None:
    masker = Masker([TOKEN])
    assert preview_part(decimal(TOKEN[:5]), "", masker) is None  # nothing to show yet
    part = preview_part(f"**so far** ok {decimal(TOKEN[:9])}", " ✍️", masker)
    assert part is not None and part.text == "so far ok ✍️"
    assert covered(part) == [("bold", "so far")]
    grown = masked_growing(render_markdown(f"**a {hexadecimal(TOKEN[:8])}**"), masker)
    assert grown.text == "a " and covered(grown) == [("bold", "a ")]
    assert_clean(grown, masker)


_PIECES = st.sampled_from(
    [
        "a", " ", "\n", "\n\n", "😀", "**", "*", "_", "`", "~~", "> ", "- ", "1. ", "```\n",
        "[", "](https://h/", ")", "\\", "&#49;", "&#x3a;", "123", "456:", TOKEN[:4],
        TOKEN[4:], TOKEN, OTHER[:5], OTHER[5:], "é",
    ]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=40), st.integers(min_value=8, max_value=60))
def test_masked_rendered_markdown_keeps_valid_entities_whatever_the_input(
    pieces: list[str], limit: int
) -> None:
    masker = Masker([TOKEN, OTHER])
    source = "".join(pieces)
    rendered = render_markdown(source)
    for out in (masked(rendered, masker), masked_growing(rendered, masker)):
        assert_clean(out, masker)
        for part in split_formatted(out, limit):
            assert_clean(part, masker)
    for part in message_parts(source, True, masker, limit=limit):
        assert_clean(part, masker)


# -- the attack, through a running daemon ----------------------------------------------------
def leaks(api: FakeTelegramAPI) -> list[str]:
    """Where a secret reached the Bot API: in any call's parameters (texts, captions,
    entities and their URLs, buttons), in the texts of consecutive messages read as one
    (a secret cut in two), or as a draft or preview ending in the start of one."""
    found = []
    for call in api.calls:
        params = json.dumps(call.params, ensure_ascii=False, default=str)
        found += [f"{call.method}: {params[:80]}…" for s in SECRETS if s in params][:1]
    messages = [c for c in api.calls if c.method == "sendMessage" and c.ok]
    for chat in {int(c.params["chat_id"]) for c in messages}:
        joined = "".join(text_of(c) for c in messages if int(c.params["chat_id"]) == chat)
        found += [f"sendMessage texts in {chat} read as one" for s in SECRETS if s in joined][:1]
    for call in api.calls:
        if call.method in ("sendMessageDraft", "sendMessage", "editMessageText"):
            shown = text_of(call).removesuffix(" ✍️")
            if any(shown.endswith(TOKEN[:n]) for n in range(4, len(TOKEN))):
                found.append(f"{call.method} ends with the start of the token: …{shown[-12:]}")
    return found


def text_of(call: Call) -> str:
    return str(call.params.get("text", ""))


FILLER = 4090  # the token's rendered text begins here: Telegram's cut at 4096 is inside it
CHUNK = FILLER + len(decimal(TOKEN[:6]))  # what the fake model streams an event
DISGUISES = (
    f"Hex {hexadecimal(TOKEN)}, emphasis {TOKEN[:4]}**{TOKEN[4:6]}**{TOKEN[6:]}, "
    f"escapes {TOKEN.replace(':', chr(92) + ':').replace('-', chr(92) + '-')}, "
    f"a [link](https://h/{decimal(TOKEN[:1])}{TOKEN[1:]}) and `{decimal(TOKEN)}` as code. "
)
# A reply longer than one message, the token's start in its first part, its end in the
# second; then every other disguise, and "z"s written as references (they are short
# when rendered): the second event ends with them, in the reply's second message.
_MIDDLE = TOKEN[6:] + " is the token, in disguise.\n\n" + DISGUISES
LONG = (
    "y" * FILLER
    + decimal(TOKEN[:6])
    + _MIDDLE
    + "&#122;" * ((CHUNK - len(_MIDDLE)) // 6)
    + "z" * ((CHUNK - len(_MIDDLE)) % 6)
    + " END"
)
SHORT = f"In a group: {DISGUISES}. END"


async def test_attack_secret_in_markdown_disguises_never_reaches_the_bot_api(
    state_dir: Path,
) -> None:
    """A model reply writes the bot token as character references (decimal and hex),
    with emphasis inside, with backslash escapes, in a link's URL, across the cut
    between two messages and across streamed drafts; then the same in a group, where
    the reply is previewed in a message edited as it grows. No Bot API call carries it."""
    assert LONG[2 * CHUNK - 1] == "z" and len(LONG) > 2 * CHUNK
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply(LONG)
        llm.reply(SHORT)
        # Events: the role, then CHUNK characters each. The stream holds after the first
        # (the draft's text ends in the token's first 6 characters), then after the second
        # (the token whole, and more: the newest draft shows the reply's second message).
        llm.stream_chunk_chars = CHUNK
        llm.stream_hold_after = 2
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            say(api, "show me the token, in disguise")
            await llm.wait_until(lambda: llm.stream_holding == 1)
            first = await api.wait_for_call("sendMessageDraft")
            assert text_of(first).startswith("y" * FILLER)
            # The brain hands its preview a text at most every PREVIEW_EVERY: the next
            # event, read after this, is handed on.
            await asyncio.sleep(PREVIEW_EVERY)
            llm.stream_hold_after = 3
            llm.stream_release.set()
            llm.stream_release.clear()  # the stream goes on, and holds again
            await llm.wait_until(lambda: llm.stream_holding == 2)
            await api.wait_for_call("sendMessageDraft", lambda c: text_of(c).endswith("zzzz"))
            llm.stream_hold_after = 2  # from here on: the group's, after its whole text
            llm.stream_release.set()
            await api.wait_for_call("sendMessage", lambda c: c.ok and "END" in text_of(c))
            finals = [c for c in api.calls if c.method == "sendMessage" and c.ok]
            assert len(finals) == 2  # the reply, in two messages
            llm.stream_release.clear()
            say(api, "@echo_test_bot and here?", chat_type="group")
            await llm.wait_until(lambda: llm.stream_holding == 3)
            group = -(10**12 + OWNER)
            await api.wait_for_call("sendMessage", lambda c: c.ok and c.params["chat_id"] == group)
            llm.stream_release.set()
            await api.wait_for_call(
                "editMessageText", lambda c: c.ok and text_of(c).endswith("END"), timeout=15
            )
        assert leaks(api) == []
