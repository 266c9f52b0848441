"""The channel contract: what every channel promises, run by each channel's driver
against its own peer (drivers.py). A case that cannot apply to a channel says why, from
the channel's capabilities or its driver, never by a silent skip.

To add a channel: a driver in drivers.py and its name in ``DRIVERS`` (docs/CHANNELS.md).
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from echo_bot.app import load_channel_class
from echo_bot.approvals.display import render_call
from tests.channels.contract.drivers import (
    ACROSS,
    DISGUISES,
    DRIVERS,
    LINKS,
    LONG_LINES,
    RUN_ARGS,
    SECRET,
    Driver,
)
from tests.waiting import eventually


@pytest.fixture(params=sorted(DRIVERS))
async def driver(request: pytest.FixtureRequest, state_dir: Path) -> AsyncIterator[Driver]:
    made = DRIVERS[request.param](state_dir)
    made.fixtures = {name: request.getfixturevalue(name) for name in made.FIXTURES}
    made.proxied = made.NO_OUTAGE is None  # the peer behind a proxy the outage cases cut
    async with made.peer():
        yield made


def echoes(received: list[str]) -> list[str]:
    return [text for text in received if text.startswith("echo: ")]


async def test_a_message_is_one_committed_inbound_before_it_is_acknowledged(
    driver: Driver,
) -> None:
    async with driver.running():
        token = await driver.say("say:first")
        await driver.acknowledged(token)
        # Acknowledged: the inbound is committed, once.
        assert sum("say:first" in t for t in await driver.inbound_texts()) == 1
        await driver.wait_received("echo: first")


async def test_replies_are_delivered_once_and_in_order(driver: Driver) -> None:
    words = ["one", "two", "three", "four"]
    async with driver.running():
        for word in words:  # one conversation: its turns are the ones kept in order
            await driver.say_on(f"say:{word}")
        received = await driver.wait_received(*(f"echo: {w}" for w in words))
        assert echoes(received) == [f"echo: {w}" for w in words]


async def test_an_approval_prompt_shows_the_call_as_display_renders_it(driver: Driver) -> None:
    if driver.NO_PROMPTS:
        pytest.skip(f"not applicable to {driver.NAME}: {driver.NO_PROMPTS}")
    async with driver.running():
        await driver.say("run:shown")
        shown = await driver.prompt()
        assert render_call("shell_exec", RUN_ARGS) in shown.text, shown.text
        # Buttons where the channel has them, a typed answer where it has not.
        assert shown.buttons == driver.capabilities.buttons
        await driver.decide(shown, approve=False)
        await driver.wait_received("not run: shown")


async def test_a_decision_from_a_non_approver_is_refused(driver: Driver) -> None:
    if driver.NO_PROMPTS or driver.NO_STRANGERS:
        pytest.skip(f"not applicable to {driver.NAME}: {driver.NO_STRANGERS}")
    async with driver.running():
        await driver.say("run:guarded")
        shown = await driver.prompt()
        answer = await driver.decide(shown, approve=True, approver=False)
        assert "not allowed" in answer, answer
        assert not (driver.state_dir / "workspace" / "contract.txt").exists()
        await driver.decide(shown, approve=False)  # the approver still decides it
        await driver.wait_received("not run: guarded")
        assert not (driver.state_dir / "workspace" / "contract.txt").exists()


async def test_a_restart_loses_nothing_and_repeats_nothing(driver: Driver) -> None:
    async with driver.running():
        await driver.acknowledged(await driver.say("say:before"))
        await driver.wait_received("echo: before")
        # Acknowledged, then the daemon stops: its reply may go out now or after the start.
        await driver.acknowledged(await driver.say("say:queued"))
    async with driver.running():
        await driver.acknowledged(await driver.say("say:after"))
        received = await driver.wait_received("echo: queued", "echo: after")
        assert echoes(received) == ["echo: before", "echo: queued", "echo: after"]
        for said in ("say:before", "say:queued", "say:after"):
            assert sum(said in t for t in await driver.inbound_texts()) == 1, said


async def test_a_rate_limit_is_paced_and_the_reply_arrives_once(driver: Driver) -> None:
    if not driver.capabilities.rate_limited:
        pytest.skip(f"not applicable to {driver.NAME}: capabilities.rate_limited is False")
    async with driver.running():
        driver.rate_limit_next()
        await driver.say("say:limited")
        received = await driver.wait_received("echo: limited")
        assert driver.rate_limited() == 1  # answered 429 once, then paced and sent once
        assert echoes(received) == ["echo: limited"]


OUTAGE = 3.0  # seconds the peer stays away: over the first retries' backoff


async def until_health(driver: Driver, healthy: bool) -> None:
    await eventually(
        lambda: (driver.health() == "ok") == healthy,
        timeout=30,
        what=f"{driver.NAME}'s health {'ok' if healthy else 'not ok'} (now {driver.health()})",
    )


async def test_the_peer_away_for_a_while_and_back_loses_nothing_and_repeats_nothing(
    driver: Driver,
) -> None:
    """The network to the peer goes down for a while and comes back: the channel says so
    on /healthz, reconnects by itself, and what people sent meanwhile is answered once."""
    if driver.NO_OUTAGE:
        pytest.skip(f"not applicable to {driver.NAME}: {driver.NO_OUTAGE}")
    async with driver.running():
        await driver.acknowledged(await driver.say("say:before"))
        await driver.wait_received("echo: before")
        await until_health(driver, True)
        await driver.peer_away()
        # Said while the daemon cannot reach the peer (a push may wait for it).
        said = asyncio.ensure_future(driver.say("say:meanwhile"))
        await until_health(driver, False)
        await asyncio.sleep(OUTAGE)
        await driver.peer_back()
        await driver.acknowledged(await said)
        received = await driver.wait_received("echo: meanwhile")
        await until_health(driver, True)
        await driver.acknowledged(await driver.say("say:after"))
        received = await driver.wait_received("echo: after")
        assert echoes(received) == ["echo: before", "echo: meanwhile", "echo: after"]
        for text in ("say:before", "say:meanwhile", "say:after"):
            assert sum(text in t for t in await driver.inbound_texts()) == 1, text


async def test_a_start_with_the_peer_away_runs_and_connects_when_it_comes(
    driver: Driver,
) -> None:
    """The daemon starts while its peer cannot be reached (a boot-time network blip, the
    peer's incident): it runs, says so on /healthz, and connects once the peer is back."""
    if driver.NO_OUTAGE:
        pytest.skip(f"not applicable to {driver.NAME}: {driver.NO_OUTAGE}")
    async with driver.running():  # a first run: the channel meets its peer (a login kept)
        await driver.acknowledged(await driver.say("say:first"))
        await driver.wait_received("echo: first")
    await driver.peer_away()
    async with driver.running():
        await until_health(driver, False)
        said = asyncio.ensure_future(driver.say("say:early"))
        await asyncio.sleep(OUTAGE)
        await driver.peer_back()
        await driver.acknowledged(await said)
        received = await driver.wait_received("echo: early")
        await until_health(driver, True)
        assert echoes(received) == ["echo: first", "echo: early"]
        assert sum("say:early" in t for t in await driver.inbound_texts()) == 1


def as_read(text: str) -> str:
    """A text as a person takes it in: invisible characters unseen, look-alike forms
    read as what they look like."""
    return unicodedata.normalize(
        "NFKC", "".join(c for c in text if unicodedata.category(c) != "Cf")
    )


def shows_secret(texts: list[str]) -> bool:
    return any(SECRET in as_read(text) for text in texts)


def needs_display(driver: Driver) -> None:
    if driver.NO_DISPLAY:
        pytest.skip(f"not applicable to {driver.NAME}: {driver.NO_DISPLAY}")


async def test_attack_a_disguised_secret_never_shows_at_the_peer(driver: Driver) -> None:
    """A reply that writes a known secret in disguise (character references, escapes,
    emphasis inside it, an invisible character, full-width letters) shows the secret
    nowhere a person reads it, nor in halves across the parts of a long reply."""
    needs_display(driver)
    async with driver.running():
        await driver.say("show:disguised")
        await driver.wait_received(*(f"{name}:" for name in DISGUISES))
        await driver.say("show:across")
        await driver.say("say:done")
        await driver.wait_received("echo: done")
        shown = driver.displayed()
        assert not shows_secret(shown), shown
        # Whatever the cuts, the parts read together show it nowhere either.
        assert not shows_secret(["".join(line for text in shown for line in text.split("\n"))])
        assert sum(t.count("***") for t in shown) >= ACROSS - 10  # a cut may split a ***


async def test_attack_a_link_whose_text_names_another_host_shows_its_target(driver: Driver) -> None:
    needs_display(driver)
    async with driver.running():
        await driver.say("show:links")
        await driver.wait_received(f"link {len(LINKS) - 1}:")
        shown = "\n".join(driver.displayed())
        for number in range(len(LINKS)):
            line = next(line for line in shown.split("\n") if f"link {number}:" in line)
            assert "evil.example" in line, (LINKS[number], line)


def measured(text: str, unit: str) -> int:
    return len(text.encode("utf-16-le")) // 2 if unit == "utf16" else len(text)


async def test_a_long_reply_arrives_split_in_order_within_the_limit(driver: Driver) -> None:
    needs_display(driver)
    async with driver.running():
        await driver.say("show:long")
        await driver.wait_received("the end")
        parts = [t for t in driver.received() if "line " in t or "the end" in t]
        # Text and then files (a channel that sends long code as a file), in order.
        read = "\n".join(parts + driver.received_files())
        numbers = [int(n) for n in re.findall(r"line (\d{3})", read)]
        assert numbers == list(range(LONG_LINES)), numbers  # each once, in order
        if driver.LIMIT is not None:
            assert len(parts) > 1
            assert all(measured(p, driver.UNIT) <= driver.LIMIT for p in parts)
        assert driver.balanced()  # a code block cut in two is closed and opened again


async def test_help_lists_the_commands_as_people_type_them_there(driver: Driver) -> None:
    needs_display(driver)
    mark = driver.PREFIX
    async with driver.running():
        await driver.say(f"{mark}help")
        received = "\n".join(await driver.wait_received(f"{mark}help — show this help"))
        assert f"{mark}approvals" in received and f"{mark}tools" in received


# What a capability promises: the methods the core then calls (bus.py's protocols).
PROMISED_METHODS = {
    "media": ("fetch_media",),
    "previews": ("show_preview", "end_preview"),
    "typing": ("show_typing",),
    "shows_when_ready": ("ready",),
    "reloads": ("reload",),
    "diagnoses": ("diagnose",),
}


@pytest.mark.parametrize("name", sorted(DRIVERS))
def test_each_declared_capability_comes_with_its_methods(name: str) -> None:
    """The core wires a channel from its declared capabilities without probing it: a
    flag without its methods would fail only when first used, so it fails here."""
    channel_class = load_channel_class(DRIVERS[name].NAME)
    capabilities = channel_class.capabilities
    for flag, methods in PROMISED_METHODS.items():
        for method in methods:
            has = callable(getattr(channel_class, method, None))
            if getattr(capabilities, flag):
                assert has, f"{name} declares {flag} but has no {method}()"
