"""The host's pacer (echo_bot/pacing.py), as each network uses it: budgets per key and
for the account, spare budget only for what may be left out, refusals held, and an
account limit learned where the network publishes none."""

from __future__ import annotations

import pytest

from channels.slack.web import paced_as, rate_of
from channels.telegram.render import telegram_pacer
from echo_bot.pacing import QUIET, Pacer, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_allows_a_burst_then_paces_each_send_behind_the_last() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=1.0, burst=3, clock=clock)
    assert [bucket.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.delay() == pytest.approx(1.0)
    assert bucket.delay() == pytest.approx(2.0)
    clock.now += 2.0
    assert bucket.delay() == pytest.approx(1.0)
    clock.now += 10.0  # idle: refills, but never beyond the burst
    assert [bucket.delay() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.delay() > 0


def test_each_rate_is_kept_a_little_under_the_networks() -> None:
    clock = Clock()
    pacer = Pacer((30.0, 30.0), clock=clock)
    assert all(pacer.reserve("a") == 0.0 for _ in range(30))
    assert pacer.reserve("a") == pytest.approx(1.05 / 30)  # 5 % under 30 a second


def test_attack_typing_takes_only_spare_budget_and_never_delays_replies() -> None:
    clock = Clock()
    pacer = telegram_pacer(clock)
    typed = [n for n in range(100) if pacer.spare(None) == 0.0]
    # The overall budget is 30 messages; typing may use only what is above half of it.
    assert len(typed) == 15
    # So a burst of replies as big as half the budget goes out at once, each to a fresh
    # chat: nothing waits behind typing.
    assert [pacer.reserve(f"reply{n}") for n in range(15)] == [0.0] * 15
    # With the budget used up by replies, typing is what is left out (never waited for).
    assert pacer.spare(None) > 0
    assert pacer.reserve("reply-late") > 0


def test_a_preview_leaves_one_send_of_its_chat_for_the_reply() -> None:
    clock = Clock()
    pacer = telegram_pacer(clock)
    assert [pacer.spare("chat") for _ in range(2)] == [0.0, 0.0]  # a burst of 3
    assert pacer.spare("chat") > 0  # the last one is the reply's
    assert pacer.reserve("chat") == 0.0
    assert pacer.spare("other") == 0.0  # another chat has its own


def test_a_refusal_holds_its_key_and_the_account_only_where_there_is_one() -> None:
    clock = Clock()
    slack = Pacer(rate_of, clock=clock)  # per method and conversation, no account budget
    slack.hold(paced_as("chat.postMessage", "C1"), 5.0)
    assert slack.reserve(paced_as("chat.postMessage", "C1")) == pytest.approx(5.0)
    assert slack.spare(paced_as("chat.postMessage", "C1")) == pytest.approx(5.0)
    assert slack.reserve(paced_as("chat.postMessage", "C2")) == 0.0
    assert slack.reserve(paced_as("chat.update", "C1")) == 0.0
    telegram = telegram_pacer(clock)
    telegram.hold("1", 5.0)
    assert telegram.reserve("2") == pytest.approx(5.0)


def test_slack_posts_per_conversation_and_updates_per_workspace() -> None:
    assert paced_as("chat.postMessage", "C1") != paced_as("chat.postMessage", "C2")
    assert paced_as("chat.update", "C1") == paced_as("chat.update", "C2")
    assert rate_of(paced_as("chat.postMessage", "C1")) == (1.0, 3.0)


def test_an_account_limit_no_one_published_is_learned_from_refusals() -> None:
    clock = Clock()
    pacer = Pacer((10.0, 1.0), learns=10.0, keep=0.0, clock=clock)  # as Matrix's
    assert pacer.spare("room") == 0.0  # nothing learned yet: a preview may go
    clock.now += 1
    pacer.hold("room", 2.0)
    # The room and the account wait; then the account's sends are spaced by the wait.
    assert pacer.reserve("room") == pytest.approx(2.0)
    assert pacer.reserve("other") == pytest.approx(4.0)
    assert pacer.spare("third") > 0  # refused lately: nothing to spare
    clock.now += 10
    pacer.hold("room", 2.0)  # refused again while spaced: the spacing grows
    first = pacer.reserve("room")
    assert pacer.reserve("other") - first == pytest.approx(3.0)
    for _ in range(10):
        pacer.sent()  # each send shrinks it a little
    clock.now += 30
    assert pacer.reserve("x") == 0.0
    assert pacer.reserve("y") == pytest.approx(3.0 * 0.97**10)
    clock.now += QUIET + 10  # quiet for a while: the allowance has grown back
    assert pacer.spare("room") == 0.0
    assert pacer.reserve("x") == 0.0 and pacer.reserve("y") == 0.0


def test_the_learned_spacing_has_a_ceiling() -> None:
    clock = Clock()
    pacer = Pacer((10.0, 1.0), learns=10.0, clock=clock)
    for _ in range(20):
        pacer.hold("room", 5.0)
    clock.now += 30
    pacer.reserve("a")
    assert pacer.reserve("b") == pytest.approx(10.0)
