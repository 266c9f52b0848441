"""Who may decide a request from the web console, on channels whose ids do not say which
chat is a person's own with the bot (Matrix rooms, Slack conversations): an approver
signed in to the console never decides a request another person asked in the chat it
was prompted in, which may be that person's own chat; Telegram's private chats are told
by their ids, its groups stay open to every approver as their buttons are."""

from __future__ import annotations

from echo_bot.approvals.routing import OWNER_CONSOLE, ApproverDirectory
from echo_bot.config import parse_config
from echo_bot.events import Address

ALICE, BOB = "@alice:example.org", "@bob:example.org"
ROOM = "matrix:!bobs-room:example.org"


def directory() -> ApproverDirectory:
    return ApproverDirectory(
        parse_config(
            {
                "matrix": {"allowed_users": [ALICE, BOB]},
                "slack": {"allowed_users": ["U0ALICE", "U0BOB"]},
                "telegram": {"allowed_users": [1, 2]},
            }
        )
    )


def test_an_approver_never_decides_what_another_asked_in_a_matrix_room() -> None:
    alice = Address(channel="matrix", chat_id=ALICE)
    bob = Address(channel="matrix", chat_id=BOB)
    found = directory()
    assert not found.console_decides(ROOM, BOB, alice, ALICE, ROOM)  # Bob's, where he asked
    assert found.console_decides(ROOM, BOB, bob, BOB, ROOM)  # Bob his own
    assert found.console_decides(ROOM, ALICE, alice, ALICE, ROOM)  # Alice hers, anywhere
    # Routed there from elsewhere (a webhook's deliver_to): any approver, as in the room.
    assert found.console_decides(ROOM, "hook", alice, ALICE, "webhook:deploys")
    assert found.console_decides(ROOM, BOB, OWNER_CONSOLE, "owner", ROOM)


def test_a_slack_dm_is_kept_to_its_person_and_telegram_groups_stay_open() -> None:
    found = directory()
    alice = Address(channel="slack", chat_id="U0ALICE")
    dm = "slack:D0BOB"
    assert not found.console_decides(dm, "U0BOB", alice, "U0ALICE", dm)
    telegram_alice = Address(channel="telegram", chat_id="1")
    group = "telegram:-100"
    assert found.console_decides(group, "2", telegram_alice, "1", group)
    assert not found.console_decides("telegram:2", "2", telegram_alice, "1", "telegram:2")


def test_a_room_its_channel_said_is_someones_direct_chat_is_theirs_alone() -> None:
    """Round 3, finding 3 on Matrix and Slack: a prompt routed to one approver's direct
    room (``[approvals] default_chat``) is that approver's; another approver signed in to
    the console cannot decide it, whoever asked."""
    found = directory()
    alice = Address(channel="matrix", chat_id=ALICE)
    bob = Address(channel="matrix", chat_id=BOB)
    routed = "webhook:deploys"  # asked elsewhere, routed to Bob's direct room
    assert not found.console_decides(ROOM, "hook", alice, ALICE, routed, direct_with=BOB)
    assert found.console_decides(ROOM, "hook", bob, BOB, routed, direct_with=BOB)
    slack_alice = Address(channel="slack", chat_id="U0ALICE")
    assert not found.console_decides(
        "slack:D0BOB", "hook", slack_alice, "U0ALICE", routed, direct_with="U0BOB"
    )
    assert found.console_decides(ROOM, BOB, OWNER_CONSOLE, "owner", ROOM, direct_with=BOB)
