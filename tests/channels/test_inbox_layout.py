"""The inbox's layout: a file's path says who sent it, and no two senders share a folder."""

from __future__ import annotations

from pathlib import PurePosixPath

from hypothesis import given
from hypothesis import strategies as st

from echo_bot.media.inbox import sender_folder, sent_by


def test_a_senders_folder_is_plain_for_telegram_ids() -> None:
    assert sender_folder("telegram", "42") == "telegram-42"


NAMES = st.text(min_size=1, max_size=20)


@given(NAMES, NAMES, NAMES, NAMES)
def test_two_senders_never_share_a_folder(
    channel: str, first: str, other_channel: str, second: str
) -> None:
    if (channel, first) != (other_channel, second):
        assert sender_folder(channel, first) != sender_folder(other_channel, second)
    assert "/" not in sender_folder(channel, first)


@given(st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True), NAMES)
def test_a_senders_folder_is_never_hidden(channel: str, sender: str) -> None:
    """Channel names are identifiers (the registry's); whoever the sender is, the
    folder's name starts with the channel's."""
    folder = sender_folder(channel, sender)
    assert folder.startswith(channel + "-") and folder not in (".", "..")


def test_a_dash_in_a_channel_name_cannot_make_two_senders_one() -> None:
    assert sender_folder("a-b", "c") != sender_folder("a", "b-c")


def test_a_file_is_the_senders_only_inside_their_own_folder() -> None:
    own = PurePosixPath("inbox/telegram-77/2026-12-03/abcd1234-1-photo.jpg")
    assert sent_by(own, "telegram", "77")
    assert not sent_by(own, "telegram", "42")
    assert not sent_by(PurePosixPath("inbox/2026-12-03/abcd1234-1-photo.jpg"), "telegram", "77")
    assert not sent_by(PurePosixPath("inbox/telegram-77"), "telegram", "77")
    assert not sent_by(PurePosixPath("owner-notes.txt"), "telegram", "77")
