"""The example MCP server the README runs (`echo_bot.examples.notes_server`) is safe to
run: it writes only new notes in its folder — a title is never a path, an existing note
is never replaced, a link in the folder is never followed. (Over the wire, as the README
has it: tests/test_readme_examples.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_bot.examples.notes_server import Refused, add_note, list_notes, read_note


@pytest.mark.parametrize(
    "title", ["../escape", "/etc/passwd", ".bashrc", "a/b", "", " padded", "x" * 65, "a\nb"]
)
def test_a_title_that_is_not_a_plain_name_is_refused(tmp_path: Path, title: str) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    with pytest.raises(Refused, match="a title is up to 64"):
        add_note(folder, title, "text")
    with pytest.raises(Refused, match="a title is up to 64"):
        read_note(folder, title)
    assert list(tmp_path.rglob("*")) == [folder]


def test_a_note_is_added_once_and_never_replaced(tmp_path: Path) -> None:
    assert add_note(tmp_path, "Einkäufe 2.0", "milk") == "added Einkäufe 2.0"
    with pytest.raises(Refused, match="exists already"):
        add_note(tmp_path, "Einkäufe 2.0", "nothing")
    assert read_note(tmp_path, "Einkäufe 2.0") == "milk"
    assert list_notes(tmp_path) == "Einkäufe 2.0"


def test_a_link_in_the_folder_is_neither_written_through_nor_read(tmp_path: Path) -> None:
    folder, secret = tmp_path / "notes", tmp_path / "secret"
    folder.mkdir()
    secret.write_text("the key")
    (folder / "key.md").symlink_to(secret)
    with pytest.raises(Refused, match="exists already"):
        add_note(folder, "key", "overwritten")
    with pytest.raises(Refused, match="cannot be read"):
        read_note(folder, "key")
    assert secret.read_text() == "the key"
    assert list_notes(folder) == "(no notes)"
