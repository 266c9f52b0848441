"""Photos, voice notes, documents and the rest, sent to the bot from Telegram.

The real aiogram client fetches files from the fake Bot API (getFile, then the file
URL); the real openai SDK sends photos to the fake OpenAI server as image input and
voice notes to its /v1/audio/transcriptions.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tests.channels.test_telegram import OWNER, reply_to, say, sends, telegram_bot
from tests.fakes.openai_api import FakeOpenAI, HttpError
from tests.fakes.telegram_api import FakeTelegramAPI

MODEL = "gpt-test"
JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 40  # ~10 KB that starts like a JPEG
OGG = b"OggS" + b"\x00voice" * 500


def llm_extra(llm: FakeOpenAI, openai: str = "") -> str:
    return (
        f'[openai]\nbase_url = "{llm.base_url}"\nmodel = "{MODEL}"\ntimeout = "5s"\n'
        f'max_retries = 0\n{openai}\n[brain]\nkind = "openai"\n'
    )


def send(api: FakeTelegramAPI, **content: Any) -> int:
    """The owner sends a message with this content; its message id."""
    return say(api, "", content=content)


def saved_files(state_dir: Path) -> list[Path]:
    inbox = state_dir / "workspace" / "inbox"
    return sorted(p for p in inbox.rglob("*") if p.is_file()) if inbox.exists() else []


def user_content(llm: FakeOpenAI) -> Any:
    """What the model was given as the newest user message."""
    body = llm.chat_requests()[-1]
    return [m for m in body["messages"] if m["role"] == "user"][-1]["content"]


# -- photos -------------------------------------------------------------------------------
async def test_a_photo_with_caption_reaches_a_model_that_sees_as_image_input(
    state_dir: Path,
) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply("A cat on a sofa.")
        extra = llm_extra(llm, "vision = true")
        async with telegram_bot(state_dir, extra) as (_bot, api):
            message_id = send(api, photo=api.photo(JPEG), caption="what is this?")
            await reply_to(api, message_id, "A cat on a sofa.")
        content = user_content(llm)
        assert isinstance(content, list)
        text = next(p["text"] for p in content if p["type"] == "text")
        assert text.startswith("what is this?")
        assert "[photo saved: inbox/" in text
        image = next(p for p in content if p["type"] == "image_url")
        url = image["image_url"]["url"]
        assert url.startswith("data:image/jpeg;base64,")
        assert base64.b64decode(url.split(",", 1)[1]) == JPEG  # the full size, not the thumb
    [saved] = saved_files(state_dir)
    assert saved.read_bytes() == JPEG


async def test_without_vision_the_model_is_told_where_the_photo_is(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply("Noted.")
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            message_id = send(api, photo=api.photo(JPEG))
            await reply_to(api, message_id, "Noted.")
        content = user_content(llm)
        assert isinstance(content, str)
        assert content.startswith("[photo saved: inbox/") and "10.2 KB" in content


async def test_the_rules_brain_answers_with_where_the_photo_was_saved(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        message_id = send(api, photo=api.photo(JPEG))
        call = await reply_to(api, message_id, "saved in the workspace as inbox/")
    [saved] = saved_files(state_dir)
    relative = saved.relative_to(state_dir / "workspace").as_posix()
    assert relative in call.params["text"]
    assert saved.read_bytes() == JPEG


async def test_the_largest_photo_size_under_the_limit_is_fetched(state_dir: Path) -> None:
    big = b"B" * 3000
    async with telegram_bot(state_dir, telegram='max_download = "2KB"') as (_bot, api):
        message_id = send(api, photo=api.photo(big, small=b"S" * 500))
        await reply_to(api, message_id, "saved in the workspace")
    [saved] = saved_files(state_dir)
    assert saved.read_bytes() == b"S" * 500


# -- voice --------------------------------------------------------------------------------
async def test_a_voice_note_is_transcribed_shown_back_and_answered(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.transcripts.append("remind me to water the plants")
        llm.reply("I will remind you.")
        extra = llm_extra(llm, 'transcription_model = "whisper-1"')
        async with telegram_bot(state_dir, extra) as (_bot, api):
            voice = {**api.add_file(OGG, "voice.oga"), "duration": 3, "mime_type": "audio/ogg"}
            message_id = send(api, voice=voice)
            answer = await reply_to(api, message_id, "I will remind you.")
            quote = await reply_to(api, message_id, "remind me to water the plants")
            assert api.calls.index(quote) < api.calls.index(answer)  # what was heard, first
        [(model, _name, data)] = llm.transcriptions
        assert model == "whisper-1" and data == OGG
        content = user_content(llm)
        assert content.startswith("remind me to water the plants\n[voice note saved: inbox/")


async def test_without_transcription_the_reply_says_how_to_switch_it_on(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        message_id = send(api, voice={**api.add_file(OGG), "duration": 2})
        hint = await reply_to(api, message_id, "transcription_model")
        assert "cannot listen" in hint.params["text"]
        await reply_to(api, message_id, "voice note is saved in the workspace as inbox/")
    assert [p.read_bytes() for p in saved_files(state_dir)] == [OGG]


async def test_transcription_on_its_own_server_and_its_failure_said(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm, FakeOpenAI() as whisper:
        whisper.transcripts += ["first words", HttpError(500)]
        llm.reply("Understood.")
        llm.reply("I could not hear it, sorry.")
        extra = llm_extra(
            llm, f'transcription_model = "small"\ntranscription_base_url = "{whisper.base_url}"'
        )
        async with telegram_bot(state_dir, extra) as (_bot, api):
            message_id = send(api, voice={**api.add_file(OGG), "duration": 2})
            await reply_to(api, message_id, "first words")
            await reply_to(api, message_id, "Understood.")
            message_id = send(api, voice={**api.add_file(OGG), "duration": 2})
            await reply_to(api, message_id, "could not transcribe your voice note")
            await reply_to(api, message_id, "I could not hear it")
        assert "transcription failed" in user_content(llm)
        assert [model for model, _, _ in whisper.transcriptions] == ["small", "small"]
        assert llm.transcriptions == []


# -- documents ----------------------------------------------------------------------------
async def test_a_document_is_saved_and_file_read_opens_it(state_dir: Path) -> None:
    report = b"quarterly numbers: 42\n"
    async with telegram_bot(state_dir) as (_bot, api):
        document = {**api.add_file(report, "report.txt"), "file_name": "report.txt",
                    "mime_type": "text/plain"}  # fmt: skip
        message_id = send(api, document=document, caption="keep this")
        await reply_to(api, message_id, "document is saved in the workspace as inbox/")
        [saved] = saved_files(state_dir)
        relative = saved.relative_to(state_dir / "workspace").as_posix()
        assert relative.endswith("-1-report.txt")
        asked = say(api, f'/tool file_read {{"path": "{relative}"}}')
        await reply_to(api, asked, "quarterly numbers: 42")


async def test_hostile_file_names_stay_inside_the_inbox(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        for name in ("../../../etc/passwd", ".bashrc", "a\u202eexe.txt", "x" * 300, "..", ""):
            document = {**api.add_file(b"data", "f"), "file_name": name}
            message_id = send(api, document=document)
            await reply_to(api, message_id, "saved in the workspace as inbox/")
    inbox = (state_dir / "workspace" / "inbox").resolve()
    saved = saved_files(state_dir)
    assert len(saved) == 6
    for path in saved:
        assert path.resolve().is_relative_to(inbox)
        assert not path.name.startswith(".") and len(path.name) <= 100


# -- what cannot be fetched -------------------------------------------------------------
async def test_a_file_over_the_limit_is_a_note_not_a_failed_turn(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        document = {**api.add_file(b"x", "big.iso", size=25 * 1000**2), "file_name": "big.iso"}
        message_id = send(api, document=document)
        call = await reply_to(api, message_id, "could not download your document")
        assert "25.0 MB, over the 20.0 MB download limit" in call.params["text"]
        assert "'big.iso'" in call.params["text"]
        assert api.calls_of("getFile") == []  # its announced size says enough
    assert saved_files(state_dir) == []


async def test_issue28_a_refused_document_is_named_with_its_type_and_size(
    state_dir: Path,
) -> None:
    """Issue 28: the note on a document over max_download did not name it, so the model
    could not tell which file was refused."""
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply("That one is too big.")
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            document = {
                **api.add_file(b"x", "big.iso", size=25 * 1000**2),
                "file_name": "big.iso",
                "mime_type": "application/x-iso9660-image",
            }
            message_id = send(api, document=document, caption="install this")
            await reply_to(api, message_id, "That one is too big.")
        assert user_content(llm) == (
            "install this\n[document not downloaded: 'big.iso' (application/x-iso9660-image,"
            " 25.0 MB) — it is 25.0 MB, over the 20.0 MB download limit ([telegram] "
            "max_download)]"
        )


async def test_an_expired_file_is_a_clear_note(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        photo = api.photo(JPEG)
        api.forget_file(photo[-1]["file_id"])
        message_id = send(api, photo=photo)
        call = await reply_to(api, message_id, "could not download your photo")
        assert "invalid file_id" in call.params["text"]


async def test_a_dropped_download_is_tried_again(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        api.fail_downloads(1)
        message_id = send(api, photo=api.photo(JPEG))
        await reply_to(api, message_id, "saved in the workspace")
        assert len(api.downloads) == 2
    assert [p.read_bytes() for p in saved_files(state_dir)] == [JPEG]


async def test_with_media_off_nothing_is_downloaded(state_dir: Path) -> None:
    async with FakeOpenAI(model=MODEL) as llm:
        llm.reply("ok")
        extra = llm_extra(llm)
        async with telegram_bot(state_dir, extra, telegram="media = false") as (_bot, api):
            message_id = send(api, photo=api.photo(JPEG), caption="look")
            await reply_to(api, message_id, "ok")
            assert api.calls_of("getFile") == []
        assert user_content(llm) == "look\n[photo not downloaded: [telegram] media is off]"


# -- not files ----------------------------------------------------------------------------
async def test_stickers_places_contacts_and_polls_reach_the_brain_described(
    state_dir: Path,
) -> None:
    contents: list[tuple[dict[str, Any], str]] = [
        (
            {"sticker": {"file_id": "s1", "file_unique_id": "us1", "type": "regular",
                         "width": 512, "height": 512, "is_animated": False,
                         "is_video": False, "emoji": "👍", "set_name": "Thumbs"}},
            "[sticker 👍 from the set Thumbs]",
        ),
        ({"location": {"latitude": 52.52, "longitude": 13.405}}, "[location: 52.52000, 13.40500]"),
        (
            {"contact": {"phone_number": "+491701234567", "first_name": "Ada"}},
            "[contact: Ada, +491701234567]",
        ),
        (
            {"poll": {"id": "p1", "question": "Lunch?", "total_voter_count": 0,
                      "is_closed": False, "is_anonymous": True, "type": "regular",
                      "allows_multiple_answers": False, "allows_revoting": False,
                      "members_only": False,
                      "options": [{"text": "Pizza", "voter_count": 0, "persistent_id": "a"},
                                  {"text": "Soup", "voter_count": 0, "persistent_id": "b"}]}},
            "[poll: Lunch? — Pizza / Soup]",
        ),
        ({"dice": {"emoji": "🎲", "value": 4}}, "[dice 🎲: 4]"),
        ({"game": {"title": "g", "description": "d", "photo": []}}, "cannot read: game"),
    ]  # fmt: skip
    async with FakeOpenAI(model=MODEL) as llm:
        async with telegram_bot(state_dir, llm_extra(llm)) as (_bot, api):
            for content, described in contents:
                llm.reply("seen")
                message_id = send(api, **content)
                await reply_to(api, message_id, "seen")
                assert described in user_content(llm), content
        assert not any("only understand text" in c.params["text"] for c in sends(api))


async def test_a_group_photo_with_a_mention_in_its_caption_is_answered(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        group = -(10**12 + OWNER)
        say(api, "", chat_type="group", content={"photo": api.photo(JPEG), "caption": "nice"})
        message_id = say(
            api,
            "",
            chat_type="group",
            content={"photo": api.photo(JPEG), "caption": "@echo_test_bot keep this"},
        )
        await reply_to(api, message_id, "saved in the workspace", chat_id=group)
        assert len(saved_files(state_dir)) == 1  # the photo not addressed to the bot: left


async def test_hostile_media_fields_get_an_answer_not_a_crash(state_dir: Path) -> None:
    async with telegram_bot(state_dir) as (_bot, api):
        document = {
            **api.add_file(b"data", "f"),
            "file_name": "n" * 10_000 + "\u0000\ud800.txt",
            "mime_type": "text/\x00plain" + "x" * 500,
            "file_size": -5,
        }
        voice = {**api.add_file(OGG), "duration": -3}
        content: dict[str, Any]
        for content in (
            {"document": document, "caption": "c" * 20_000},
            {"voice": voice},
            {"photo": []},
            {"photo": [{"file_id": "", "file_unique_id": "", "width": 0, "height": 0}]},
        ):
            message_id = send(api, **content)
            await reply_to(api, message_id)
        message_id = say(api, "what time is it?")
        await reply_to(api, message_id, "It is")
