"""Channels are plugins (echo_bot/plugins.py): found under the ``echo_bot.channels``
entry point group, the built-in ones too. A plugin that is broken is named with its
reason by check-config, run and doctor (exit 2, one line each, no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from echo_bot.plugins import GROUP, ChannelSpec, registry
from echo_bot.sections import ChatSection
from tests.conftest import ROOT, echo_bot_env


def installed(site: Path, name: str, points: dict[str, str]) -> None:
    """A distribution ``name`` as pip would leave it in ``site``: its metadata and its
    entry points in the channels' group."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = "".join(f"{key} = {value}\n" for key, value in points.items())
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")


def echo_bot(site: Path, *args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = echo_bot_env()
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", str(ROOT))])
    return subprocess.run(
        [sys.executable, "-m", "echo_bot", *args, "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_the_built_in_channels_are_plugins_like_any_other() -> None:
    found = registry()
    assert {"cli", "telegram", "matrix", "slack", "webhook"} <= set(found.names)
    assert found.broken == ()
    assert found["slack"].prefix == "!" and found["matrix"].install == "echo-bot[matrix]"


def test_a_broken_plugin_is_named_with_its_reason_by_check_config_run_and_doctor(
    tmp_path: Path,
) -> None:
    site = tmp_path / "site"
    installed(site, "echo-bot-gone", {"gone": "echo_bot_gone_module:SPEC"})
    installed(site, "echo-bot-odd", {"odd": "json:dumps"})
    installed(site, "echo-bot-rival", {"telegram": "channels.specs:TELEGRAM"})
    # doctor's status is 1 for any failed check (its config line names them here).
    for command, status in ((["check-config"], 2), (["run"], 2), (["doctor"], 1)):
        done = echo_bot(site, *command, tmp_path=tmp_path)
        assert done.returncode == status, (command, done.stdout, done.stderr)
        text = done.stdout + done.stderr
        assert "Traceback" not in text, text
        assert "channel plugin 'gone' from echo_bot_gone_module:SPEC (package echo-bot-gone)" \
            " cannot be loaded: ModuleNotFoundError" in text, text  # fmt: skip
        assert "channel plugin 'odd' from json:dumps (package echo-bot-odd) is not a" \
            " ChannelSpec" in text, text  # fmt: skip
        assert "channel 'telegram' is claimed by more than one installed package" \
            " (package echo-bot, package echo-bot-rival)" in text, text  # fmt: skip


def test_management_commands_still_work_beside_a_broken_plugin(tmp_path: Path) -> None:
    """The owner can still approve, list and revoke from the shell while a plugin is
    broken: only the commands that would run or vouch for the channels stop."""
    site = tmp_path / "site"
    installed(site, "echo-bot-gone", {"gone": "echo_bot_gone_module:SPEC"})
    done = echo_bot(site, "pairings", "list", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr


def test_addresses_read_by_what_each_channels_spec_says_of_its_ids() -> None:
    """A Matrix room ID holds a colon of its own (``colons_in_chat_ids``); elsewhere a
    third part is a thread. The core names no channel to know it."""
    from echo_bot.events import Address

    room = Address.parse("matrix:!opaque:example.org")
    assert (room.chat_id, room.thread_id) == ("!opaque:example.org", None)
    topic = Address.parse("telegram:-100123:7")
    assert (topic.chat_id, topic.thread_id) == ("-100123", "7")
    assert str(Address.parse(str(room))) == "matrix:!opaque:example.org"


def test_a_chat_section_says_who_chats_and_approves_unless_its_spec_says_otherwise() -> None:
    class Section(ChatSection[int]):
        pass

    bare = ChannelSpec(name="x", target="x:X", config_model=Section)
    section = Section(enabled=True, allowed_users=[1, 2])
    assert bare.enabled is not None and bare.enabled(section, {}, True)
    assert set(bare.allowed_users(section)) == {"1", "2"}
    assert set(bare.approvers(section)) == {"1", "2"}  # unset: the allowed users
    assert set(bare.approvers(Section(allowed_users=[1, 2], approvers=[2]))) == {"2"}
    assert bare.live_keys == {"allowed_users", "approvers"}
    own = ChannelSpec(name="y", target="y:Y", config_model=Section, approvers=lambda s: {"9"},
                      enabled=lambda s, environ, from_file: False)  # fmt: skip
    assert own.enabled is not None and not own.enabled(section, {}, True)
    assert set(own.approvers(section)) == {"9"}
    assert ChannelSpec(name="z", target="z:Z").allowed_users(section) == ()
