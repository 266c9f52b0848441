"""send_file: a workspace file sent back to a chat as a document or a photo."""

from __future__ import annotations

import json
from pathlib import Path

from tests.channels.test_telegram import (
    APPROVE_ONCE,
    OWNER,
    edited,
    keyboard,
    press,
    prompt_in,
    reply_to,
    say,
    telegram_bot,
    text_of,
)
from tests.fakes.telegram_api import UploadedFile


def workspace(state_dir: Path) -> Path:
    path = state_dir / "workspace"
    path.mkdir(exist_ok=True)
    return path


def call(args: dict[str, object]) -> str:
    return f"/tool send_file {json.dumps(args)}"


def uploaded(params: dict[str, object], field: str) -> UploadedFile:
    value = params[field]
    if isinstance(value, str) and value.startswith("attach://"):
        value = params[value.removeprefix("attach://")]
    assert isinstance(value, UploadedFile), value
    return value


async def test_a_file_goes_to_the_requesters_chat_without_asking(state_dir: Path) -> None:
    (workspace(state_dir) / "report.txt").write_bytes(b"numbers: 42\n")
    async with telegram_bot(state_dir) as (_bot, api):
        asked = say(api, call({"path": "report.txt", "caption": "the **report**"}))
        sent = await api.wait_for_call("sendDocument", lambda c: c.ok)
        await reply_to(api, asked, "Sent report.txt")
        document = uploaded(sent.params, "document")
        assert document.data == b"numbers: 42\n" and document.filename == "report.txt"
        assert sent.params["caption"] == "the **report**"  # a tool's caption is plain
        assert int(sent.params["chat_id"]) == OWNER
        assert not [c for c in api.calls_of("sendMessage") if keyboard(c)]  # nobody asked
    assert list((state_dir / "outgoing").iterdir()) == []  # the copy is gone once sent


async def test_an_image_goes_as_a_photo_and_falls_back_to_a_document(state_dir: Path) -> None:
    (workspace(state_dir) / "chart.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"p" * 100)
    async with telegram_bot(state_dir) as (_bot, api):
        say(api, call({"path": "chart.png"}))
        photo = await api.wait_for_call("sendPhoto", lambda c: c.ok)
        assert uploaded(photo.params, "photo").data.startswith(b"\x89PNG")
        api.fail_next("sendPhoto", status=400, description="Bad Request: PHOTO_INVALID_DIMENSIONS")
        say(api, call({"path": "chart.png"}))
        document = await api.wait_for_call("sendDocument", lambda c: c.ok)
        assert uploaded(document.params, "document").filename == "chart.png"


async def test_a_file_for_another_chat_waits_for_approval(state_dir: Path) -> None:
    (workspace(state_dir) / "notes.md").write_text("# notes\n")
    other = 555
    async with telegram_bot(state_dir) as (_bot, api):
        asked = say(api, call({"path": "notes.md", "to": f"telegram:{other}"}))
        prompt = await prompt_in(api)
        assert "notes.md" in prompt.params["text"] and f"telegram:{other}" in prompt.params["text"]
        assert api.calls_of("sendDocument") == []
        approve = next(data for _label, data in keyboard(prompt) if APPROVE_ONCE.match(data))
        press(api, approve, int(prompt.response["result"]["message_id"]))  # type: ignore[index]
        sent = await api.wait_for_call("sendDocument", lambda c: c.ok)
        assert int(sent.params["chat_id"]) == other
        await edited(api, int(prompt.response["result"]["message_id"]), "✅")  # type: ignore[index]
        await reply_to(api, asked, "Sent notes.md")


async def test_paths_outside_the_workspace_and_symlinks_are_refused(state_dir: Path) -> None:
    root = workspace(state_dir)
    secret = state_dir / "secret.txt"
    secret.write_text("do not send")
    (root / "link.txt").symlink_to(secret)
    async with telegram_bot(state_dir) as (_bot, api):
        for path, answer in [
            ("../secret.txt", "outside the workspace"),
            ("/etc/passwd", "absolute paths are not allowed"),
            ("link.txt", "outside the workspace"),
            ("missing.txt", "no such file"),
            ("", "INVALID_PARAMETER"),
        ]:
            asked = say(api, call({"path": path}))
            await reply_to(api, asked, answer)
        assert api.calls_of("sendDocument") == [] and api.calls_of("sendPhoto") == []


async def test_a_photo_over_telegrams_limit_is_refused_before_sending(state_dir: Path) -> None:
    (workspace(state_dir) / "huge.jpg").write_bytes(b"\xff" * (10 * 1000**2 + 1))
    async with telegram_bot(state_dir) as (_bot, api):
        asked = say(api, call({"path": "huge.jpg"}))
        await reply_to(api, asked, "over 10.0 MB")
        assert api.calls_of("sendPhoto") == []


async def test_a_caption_over_telegrams_limit_follows_the_file_whole(state_dir: Path) -> None:
    """1,000 emoji and a last word: within the tool's 1,024 characters, over Telegram's
    1,024 UTF-16 units. The caption holds what fits, the rest follows as a message
    (it was cut, and "THE END" reached nobody)."""
    (workspace(state_dir) / "report.txt").write_bytes(b"numbers: 42\n")
    caption = "😀" * 1000 + " THE END"
    async with telegram_bot(state_dir) as (_bot, api):
        asked = say(api, call({"path": "report.txt", "caption": caption}))
        sent = await api.wait_for_call("sendDocument", lambda c: c.ok)
        rest = await api.wait_for_call("sendMessage", lambda c: c.ok and "THE END" in text_of(c))
        await reply_to(api, asked, "Sent report.txt")
    shown = str(sent.params["caption"]) + text_of(rest)
    assert shown.count("😀") == 1000 and "THE END" in shown
