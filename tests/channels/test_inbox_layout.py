"""The inbox's layout: a file's path says who sent it, and no two senders share a folder."""

from __future__ import annotations

from pathlib import PurePosixPath

from hypothesis import given
from hypothesis import strategies as st

from echo_bot.media.inbox import sender_folder, sent_by


def test_a_senders_folder_is_plain_for_telegram_ids() -> None:
    assert sender_folder("telegram", "42") == "telegram-42"


@given(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_two_senders_never_share_a_folder(first: str, second: str) -> None:
    if first != second:
        assert sender_folder("matrix", first) != sender_folder("matrix", second)
    folder = sender_folder("matrix", first)
    assert not folder.startswith(".") and "/" not in folder and folder not in (".", "..")


def test_a_file_is_the_senders_only_inside_their_own_folder() -> None:
    own = PurePosixPath("inbox/telegram-77/2026-12-03/abcd1234-1-photo.jpg")
    assert sent_by(own, "telegram", "77")
    assert not sent_by(own, "telegram", "42")
    assert not sent_by(PurePosixPath("inbox/2026-12-03/abcd1234-1-photo.jpg"), "telegram", "77")
    assert not sent_by(PurePosixPath("inbox/telegram-77"), "telegram", "77")
    assert not sent_by(PurePosixPath("owner-notes.txt"), "telegram", "77")
