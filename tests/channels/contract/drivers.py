"""One driver per channel for the contract suite (test_contract.py): it runs the daemon
with that channel on a state dir, against the channel's own peer, and does what the peer
does — inject a message, read what the peer received, show and decide an approval.

Each driver says what "acknowledged" means for its channel (``ACK``): the moment the
peer is told its message is taken. A new channel adds a driver here and its name to
``DRIVERS`` (docs/CHANNELS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import make_msgid, parseaddr
from pathlib import Path
from typing import Any, ClassVar, cast

import aiohttp

from echo_bot.app import load_channel_class
from echo_bot.brains.base import BrainContext, BrainReply
from echo_bot.brains.rules import files_reply
from echo_bot.bus import Capabilities
from echo_bot.conversation import ChatMessage, ToolCall
from echo_bot.events import new_id
from echo_bot.tools.base import Tool
from tests.conftest import Bot, running_bot
from tests.fakes.channel import RecordingChannel
from tests.fakes.tcp_proxy import TcpProxy
from tests.fakes.telegram_api import FakeTelegramAPI
from tests.mail_server import AUTH_SERV_ID, PLAIN, MailServers
from tests.waiting import eventually

# What the suite asks for, found in the text wherever the channel puts it (a webhook's
# payload reaches the brain wrapped as data).
SAY = re.compile(r"say:(\w+)")
RUN = re.compile(r"run:(\w+)")
SHOW = re.compile(r"show:(\w+)")  # the reply is SHOWN[word]
# A secret the daemon knows (every secret variable is masked), with Markdown's and
# Slack's control characters in it.
SECRET = "sk-pa&ss<word>-1234567890"
SECRET_ENV = {"OPENAI_API_KEY": SECRET}
DISGUISES = {
    "entities": "sk-pa&amp;ss&lt;word&gt;-1234567890",
    "escapes": "sk-pa\\&ss\\<word\\>-1234567890",
    "emphasis": "sk-pa&ss<word>-12**345**67890",
    "zerowidth": "sk-pa&ss<word>-12345\u200b67890",
    "fullwidth": "ｓｋ-pa&ss<word>-1234567890",
}
LINKS = [
    "[**bank.com**](https://evil.example/x)",
    "[_bank.com_](https://evil.example/x)",
    "[`bank.com`](https://evil.example/x)",
    "[bank.com:443](https://evil.example/x)",
    "[bank.com.](https://evil.example/x)",
    "[ｂank.com](https://evil.example/x)",
]
ACROSS = 1_300  # copies of the secret in a reply over every channel's limit
LONG_LINES = 400  # numbered lines of a long reply, half of them in one code block
SHOWN = {
    "disguised": "\n\n".join(f"{k}: {v}" for k, v in DISGUISES.items()),
    # Over every channel's limit, masked or not: the secret (disguised) at every position
    # a cut could be.
    "across": "-".join([DISGUISES["entities"] + "-" + "y" * 10] * ACROSS),
    "links": "\n\n".join(f"link {n}: {link}" for n, link in enumerate(LINKS)),
    "long": "\n".join(f"line {n:03d} " + "words " * 8 for n in range(LONG_LINES // 2))
    + "\n\n```\n"
    + "\n".join(f"line {n:03d} " + "code " * 8 for n in range(LONG_LINES // 2, LONG_LINES))
    + "\n```\n\nthe end",
}
RUN_ARGS = {"command": "touch contract.txt"}
TOOLS = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
"""


class ContractBrain:
    """``say:WORD`` → the reply ``echo: WORD``; ``run:WORD`` → one shell_exec call (which
    asks for approval), then ``ran: WORD`` or ``not run: WORD``."""

    name = "contract"

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        last = conversation[-1]
        asked = next((m.content or "" for m in reversed(conversation) if m.role == "user"), "")
        run = RUN.search(asked)
        if last.role == "tool" and run:
            verdict = "ran" if "exit code 0" in (last.content or "") else "not run"
            return BrainReply(text=f"{verdict}: {run.group(1)}", route_reason="test: report")
        if run:
            call = ToolCall(id=new_id(), name="shell_exec", args=dict(RUN_ARGS))
            return BrainReply(tool_calls=[call], route_reason="test: a call that asks")
        shown = SHOW.search(last.content or "")
        if shown:
            return BrainReply(text=SHOWN[shown.group(1)], route_reason="test: shown", markdown=True)
        said = SAY.search(last.content or "")
        return BrainReply(text=f"echo: {said.group(1) if said else '?'}", route_reason="test")


class ChatBrain(ContractBrain):
    """For a chat channel's own tests: ``md:`` → ``MARKDOWN`` (a reply with mentions
    and markup in it, the network's to escape); a message with files → where each was
    saved; ``heard:`` → how much it heard; else the contract's brain."""

    MARKDOWN = ""

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        last = conversation[-1]
        text = last.content or ""
        if last.role == "user" and last.files:
            return BrainReply(text=files_reply(last.files), route_reason="test: files")
        if last.role == "user" and "md:" in text:
            return BrainReply(text=self.MARKDOWN, route_reason="test", markdown=True)
        if last.role == "user" and "heard:" in text:
            return BrainReply(text=f"heard {len(text)} characters", route_reason="test")
        return await super().step(conversation, tools, context)


@dataclass(frozen=True)
class Shown:
    """An approval prompt as the approver's peer shows it."""

    text: str
    buttons: bool  # shown with buttons to tap (else: a typed answer)
    handle: Any  # what the driver needs to decide it


class Driver:
    NAME: ClassVar[str]
    ACK: ClassVar[str]  # what "acknowledged" means for this channel
    # Why a case does not apply (None: it does), said by the driver, never skipped silently.
    NO_PROMPTS: ClassVar[str | None] = None
    NO_STRANGERS: ClassVar[str | None] = None
    NO_OUTAGE: ClassVar[str | None] = None  # why the peer cannot be taken away
    NO_DISPLAY: ClassVar[str | None] = None  # why no person reads the replies at the peer
    # What commands start with as people type them there.
    PREFIX: ClassVar[str] = "/"
    # A message's limit at the peer, in what it counts (None: none).
    LIMIT: ClassVar[int | None] = None
    UNIT: ClassVar[str] = "chars"
    # Fixtures the driver's peer needs (the session's Synapse), given as ``fixtures``.
    FIXTURES: ClassVar[tuple[str, ...]] = ()

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.fixtures: dict[str, Any] = {}
        self.bot: Bot | None = None
        self._earlier: list[str] = []  # what a peer made anew each run received before
        # Set before ``peer()``: the daemon reaches its peer through a TCP proxy
        # (``proxy``), which ``peer_away`` cuts and ``peer_back`` restores.
        self.proxied = False
        self.proxy: TcpProxy | None = None

    @property
    def capabilities(self) -> Capabilities:
        return load_channel_class(self.NAME).capabilities

    @contextlib.asynccontextmanager
    async def peer(self) -> AsyncIterator[None]:
        """The channel's peer, which outlives daemon restarts."""
        yield

    def running(self) -> contextlib.AbstractAsyncContextManager[Bot]:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def _proxy(self, url: str) -> AsyncIterator[str]:
        """``url`` (http://127.0.0.1:PORT…) as the daemon is to reach it: through a proxy
        when ``proxied``, else as it is."""
        if not self.proxied:
            yield url
            return
        port = int(url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        async with TcpProxy(port) as proxy:
            self.proxy = proxy
            yield url.replace(f"127.0.0.1:{port}", proxy.origin, 1)

    async def peer_away(self) -> None:
        """The network between the daemon and its peer goes down (the peer keeps what
        people send meanwhile)."""
        assert self.proxy is not None, "a driver made with proxied = True"
        await self.proxy.cut()

    async def peer_back(self) -> None:
        assert self.proxy is not None, "a driver made with proxied = True"
        await self.proxy.restore()

    def health(self) -> str:
        """The channel's status as /healthz shows it ("ok", "degraded", "down"…)."""
        assert self.bot is not None
        channel = next(c for c in self.bot.daemon.channels if c.name == self.NAME)
        health = getattr(channel, "health", None)
        return str(health()["status"]) if health is not None else "ok"

    async def say(self, text: str) -> Any:
        """Send ``text`` as the peer does; a token for ``acknowledged``."""
        raise NotImplementedError

    async def say_on(self, text: str) -> Any:
        """``say``, in the same conversation as this driver's earlier ``say_on``: where a
        conversation is narrower than the chat (an e-mail thread), its turns are the
        ones kept in order; separate conversations run side by side."""
        return await self.say(text)

    async def acknowledged(self, token: Any) -> None:
        """Return once the peer has been told its message is taken (``ACK``)."""
        raise NotImplementedError

    def received(self) -> list[str]:
        """The texts the peer has received in this run (replies and notices), in order."""
        raise NotImplementedError

    def received_files(self) -> list[str]:
        """The text of each text file the peer received in this run, in order (where a
        channel sends long code as a file: read whole, so no message limit applies)."""
        return []

    def displayed(self) -> list[str]:
        """What a person reads of each message the peer received in this run: the text
        as the peer shows it (escapes decoded, markup gone), one reading per line where
        the peer shows it in more than one way."""
        return self.received()

    def balanced(self) -> bool:
        """Whether every message's markup is balanced (a code block cut in two is closed
        in one message and opened again in the next)."""
        return True

    def all_received(self) -> list[str]:
        """What the peer received in every run so far (a new run of a driver whose
        peer starts afresh adds the earlier runs' texts), in order."""
        return [*self._earlier, *self.received()]

    async def prompt(self) -> Shown:
        raise NotImplementedError

    async def decide(self, shown: Shown, *, approve: bool, approver: bool = True) -> str:
        """Decide as an approver (or not); what the decider was answered, if anything."""
        raise NotImplementedError

    def rate_limit_next(self) -> None:
        """The peer's next answer to a send is "too many requests" (retry after 1 s)."""
        raise NotImplementedError

    def rate_limited(self) -> int:
        """How many sends the peer answered "too many requests"."""
        raise NotImplementedError

    async def wait_received(self, *texts: str) -> list[str]:
        """Wait until each of ``texts`` is among what the peer received; all of it, in
        every run so far."""

        def arrived() -> bool:
            got = self.all_received()
            return all(any(t in g for g in got) for t in texts)

        await eventually(arrived, timeout=15, what=f"{texts} at the {self.NAME} peer")
        return self.all_received()

    async def inbound_texts(self) -> list[str]:
        """The text of every committed inbound of this channel, oldest first (the store)."""
        assert self.bot is not None
        store = self.bot.daemon.runtime.store

        def read(tx: Any) -> list[str]:
            rows = [tx.inbox.get(s.id) for s in tx.inbox.recent(self.NAME, limit=100)]
            return [str(getattr(r.message, "text", "")) for r in reversed(rows) if r is not None]

        return list(await store.run(read))


# -- Telegram -------------------------------------------------------------------------------
TOKEN = "123456:TEST-token-value"
OWNER = 42
FRIEND = 7  # allowed to chat, not an approver


class TelegramDriver(Driver):
    NAME = "telegram"
    LIMIT, UNIT = 4096, "utf16"
    ACK = "getUpdates is called with an offset past the update (the poller confirms it)"

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.api: FakeTelegramAPI | None = None
        self.api_base = ""  # the fake's, or the proxy's in front of it

    @contextlib.asynccontextmanager
    async def peer(self) -> AsyncIterator[None]:
        async with FakeTelegramAPI(token=TOKEN) as api, self._proxy(api.base_url) as url:
            self.api, self.api_base = api, url
            yield

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bot]:
        assert self.api is not None
        config = f"""
[telegram]
enabled = true
api_base = "{self.api_base}"
allowed_users = [{OWNER}, {FRIEND}]
approvers = [{OWNER}]
{TOOLS}"""
        async with running_bot(
            self.state_dir,
            config,
            environ={"TELEGRAM_BOT_TOKEN": TOKEN, **SECRET_ENV},
            channels=["telegram"],
            channel_options={"telegram": {"poll_timeout": 1}},
            brain=ContractBrain(),
        ) as bot:
            self.bot = bot
            yield bot

    async def say(self, text: str) -> Any:
        assert self.api is not None
        return self.api.push_message(text, user_id=OWNER)

    async def acknowledged(self, token: Any) -> None:
        assert self.api is not None
        await self.api.wait_for_call(
            "getUpdates", lambda c: (c.params.get("offset") or 0) > token, 15
        )

    def received(self) -> list[str]:
        assert self.api is not None
        return [
            str(c.params.get("text", ""))
            for c in self.api.calls_of("sendMessage")
            if c.ok and int(c.params["chat_id"]) == OWNER
        ]

    async def prompt(self) -> Shown:
        assert self.api is not None
        call = await self.api.wait_for_call(
            "sendMessage", lambda c: c.ok and bool(c.params.get("reply_markup")), 15
        )
        assert call.response is not None
        rows = call.params["reply_markup"]["inline_keyboard"]
        data = [b["callback_data"] for row in rows for b in row]
        return Shown(
            text=str(call.params.get("text", "")),
            buttons=bool(data),
            handle=(int(call.response["result"]["message_id"]), data),
        )

    async def decide(self, shown: Shown, *, approve: bool, approver: bool = True) -> str:
        api = self.api
        assert api is not None
        message_id, data = shown.handle
        verb = "approve_once:" if approve else "deny:"
        action = next(d for d in data if d.startswith(verb))
        _update, callback = api.push_callback(
            action, user_id=OWNER if approver else FRIEND, message_id=message_id, chat_id=OWNER
        )
        answer = await api.wait_for_call(
            "answerCallbackQuery", lambda c: c.params.get("callback_query_id") == callback, 15
        )
        return str(answer.params.get("text") or "")

    def rate_limit_next(self) -> None:
        assert self.api is not None
        self.api.fail_next("sendMessage", status=429, retry_after=1)

    def rate_limited(self) -> int:
        assert self.api is not None
        return sum(1 for c in self.api.calls_of("sendMessage") if c.status == 429)


# -- webhook --------------------------------------------------------------------------------
HOOK_TOKEN = "contract-bearer-token-value"


class WebhookDriver(Driver):
    NAME = "webhook"
    ACK = "the POST is answered 202 (only after the inbox commit)"
    NO_PROMPTS = (
        "a webhook's peer is an HTTP client that cannot be prompted: approval prompts go to"
        " the route's deliver_to chat, shown by that chat's channel"
    )
    NO_STRANGERS = "a webhook sender cannot decide approvals: there is no decision to refuse"
    NO_OUTAGE = (
        "the daemon holds no connection to a webhook's peer: the sender connects to it, and"
        " a POST that is not answered 202 is the sender's to send again"
    )
    NO_DISPLAY = (
        "a webhook's sender is answered 202 and no text: its replies go to the route's"
        " deliver_to chat, shown by that chat's channel"
    )

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.chat = RecordingChannel("cli")  # the route's deliver_to chat

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bot]:
        config = """
[http]
port = 0
[webhook]
enabled = true
[[webhook.routes]]
name = "contract"
auth = "bearer"
secret_env = "HOOK_TOKEN"
prompt = "{payload[text]}"
deliver_to = "cli:local"
"""
        self._earlier += self.received()
        self.chat = RecordingChannel("cli")  # a new run: the chat's peer starts empty
        async with (
            running_bot(
                self.state_dir,
                config,
                channel=self.chat,
                environ={"HOOK_TOKEN": HOOK_TOKEN, **SECRET_ENV},
                channels=["webhook"],
                brain=ContractBrain(),
            ) as bot,
        ):
            self.bot = bot
            yield bot

    async def say(self, text: str) -> Any:
        assert self.bot is not None and self.bot.daemon.http is not None
        url = f"http://127.0.0.1:{self.bot.daemon.http.port}/hooks/contract"
        headers = {"Authorization": f"Bearer {HOOK_TOKEN}"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json={"text": text}, headers=headers) as answer,
        ):
            return answer.status, await answer.text()

    async def acknowledged(self, token: Any) -> None:
        status, text = token  # the answer arrived before say returned
        assert status == 202, text

    def received(self) -> list[str]:
        return [m.text for m in self.chat.sent]


# -- the terminal ---------------------------------------------------------------------------
class CliDriver(Driver):
    NAME = "cli"
    ACK = (
        "piped input: the next line is read once the reply to this one is printed (the"
        " reader's acknowledgement); the line is in the inbox before that"
    )
    NO_STRANGERS = "the terminal has one person, its owner, who approves there"
    NO_OUTAGE = "the terminal is the daemon's own standard input and output: no peer to lose"

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.out = io.StringIO()
        self._writer: Any = None
        self._shown = 0  # how much of the output a prompt read already

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bot]:
        read_fd, write_fd = os.pipe()
        stdin = os.fdopen(read_fd, "r")
        self._writer = os.fdopen(write_fd, "w", buffering=1)
        self._earlier += self.received()
        self.out, self._shown = io.StringIO(), 0  # a new terminal: an empty screen
        options = {"stdin": stdin, "stdout": self.out, "interactive": False}
        try:
            async with running_bot(
                self.state_dir,
                TOOLS,
                channel=RecordingChannel("recording"),
                environ=SECRET_ENV,
                channels=["cli"],
                channel_options={"cli": options},
                brain=ContractBrain(),
            ) as bot:
                self.bot = bot
                yield bot
        finally:
            self._writer.close()  # end of input: the reader thread ends
            await asyncio.sleep(0)

    async def say(self, text: str) -> Any:
        self._writer.write(text + "\n")
        return text

    async def acknowledged(self, token: Any) -> None:
        said = SAY.search(token)
        assert said, "the terminal's acknowledgement is the reply: say:WORD"
        await self.wait_received(f"echo: {said.group(1)}")

    def received(self) -> list[str]:
        return [line for line in self.out.getvalue().splitlines() if line]

    async def prompt(self) -> Shown:
        await eventually(
            lambda: "[y/N]" in self.out.getvalue()[self._shown :],
            timeout=15,
            what="an approval prompt on the terminal",
        )
        text = self.out.getvalue()[self._shown :]
        line = next(line for line in text.splitlines() if "[y/N]" in line)
        self._shown = len(self.out.getvalue())
        return Shown(text=line, buttons=False, handle=None)

    async def decide(self, shown: Shown, *, approve: bool, approver: bool = True) -> str:
        assert approver, self.NO_STRANGERS
        self._writer.write(("y" if approve else "n") + "\n")
        return ""

    def rate_limit_next(self) -> None:
        raise AssertionError("the terminal has no peer that rate-limits")


# -- Matrix ---------------------------------------------------------------------------------
def html_text(markup: str) -> str:
    """The text an HTML body shows in a client: references decoded, tags gone."""
    from html.parser import HTMLParser

    out: list[str] = []

    class Reader(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            out.append("\n" if tag == "br" else "")

        def handle_data(self, data: str) -> None:
            out.append(data)

    reader = Reader(convert_charrefs=True)
    reader.feed(markup)
    reader.close()
    return "".join(out)


class MatrixDriver(Driver):
    """A real Synapse (the session's ``paced_synapse``: rc_message strict enough to use
    up in the rate-limit case, loose enough for the others) and two people on matrix-nio
    clients with E2EE, as in Element: the owner (allowed, approver) opens an encrypted room and
    invites the bot and a friend (allowed, not an approver)."""

    NAME = "matrix"
    PREFIX = "!"  # Element takes /help as its own, and asks about any other /word
    LIMIT = 16_000
    ACK = (
        "the sync token the channel stored is past the event: a /sync from it (the bot's"
        " token, raw HTTP) no longer returns the event"
    )
    FIXTURES = ("paced_synapse",)

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.server: Any = None
        self.people: Any = None  # (owner, friend)
        self.room_id = ""
        self.homeserver = ""  # the server's URL, or the proxy's in front of it
        self.account: Any = None  # the bot's Registered
        self._prompted: set[str] = set()
        self.brain: Any = ContractBrain()  # None: the config's ([openai] in ``extra``)
        self.extra = ""  # more config (TOML) for the daemon
        self.friend_allowed = True  # the friend among [matrix] allowed_users

    @contextlib.asynccontextmanager
    async def peer(self) -> AsyncIterator[None]:
        from tests.matrix_people import Person, open_room
        from tests.matrix_server import unique

        self.server = server = self.fixtures.get("paced_synapse") or self.fixtures["synapse"]
        self.account = await asyncio.to_thread(server.register, unique("echo"), "bot-password")
        owner = Person(server, "owner", self.state_dir.parent / "owner")
        friend = Person(server, "friend", self.state_dir.parent / "friend")
        self.people = (owner, friend)
        try:
            for person in (owner, friend):
                await person.step()
            self.room_id = await open_room(owner, [self.account.user_id, friend.user_id])
            await friend.until(lambda: self.room_id in friend.invites, "friend invited")
            await friend.client.join(self.room_id)
            async with owner.syncing(), friend.syncing(), self._proxy(server.url) as url:
                self.homeserver = url
                yield
        finally:
            for person in (owner, friend):
                await person.client.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bot]:
        owner, friend = self.people
        allowed = [owner.user_id] + ([friend.user_id] if self.friend_allowed else [])
        config = f"""
[matrix]
enabled = true
homeserver = "{self.homeserver}"
user_id = "{self.account.user_id}"
allowed_users = {json.dumps(allowed)}
approvers = ["{owner.user_id}"]
{TOOLS}{self.extra}"""
        async with running_bot(
            self.state_dir,
            config,
            environ={"MATRIX_ACCESS_TOKEN": self.account.access_token, **SECRET_ENV},
            channels=["matrix"],
            channel_options={"matrix": {"sync_timeout": 1}},
            brain=self.brain,
        ) as bot:
            self.bot = bot
            yield bot

    async def _ready(self) -> None:
        """The bot in the room and its device known to the owner: what is said reaches
        it encrypted for it."""
        owner, _ = self.people
        bot_id = self.account.user_id

        def joined_and_known() -> bool:
            room = owner.client.rooms.get(self.room_id)
            return bool(room and bot_id in room.users and
                        list(owner.client.device_store.active_user_devices(bot_id)))  # fmt: skip

        await eventually(joined_and_known, timeout=30, what="the bot joined, its device known")

    async def say(self, text: str) -> Any:
        await self._ready()
        owner, _ = self.people
        return await owner.say(self.room_id, text)

    async def acknowledged(self, token: Any) -> None:
        from tests.matrix_people import sync_returns

        assert self.bot is not None
        name = f"matrix-sync:{self.account.user_id}"

        async def past() -> bool:
            assert self.bot is not None
            kept = await self.bot.store.run(lambda tx: tx.meta.note(name))
            if kept is None:
                return False
            found = await asyncio.to_thread(
                sync_returns, self.server.url, self.account.access_token, kept[0], token
            )
            return not found

        await eventually(past, timeout=15, what="the stored sync token past the event")

    def received(self) -> list[str]:
        owner, _ = self.people
        return cast(list[str], owner.received(self.room_id, self.account.user_id))

    def _contents(self) -> list[dict[str, Any]]:
        owner, _ = self.people
        return cast(
            list[dict[str, Any]], owner.received_contents(self.room_id, self.account.user_id)
        )

    def displayed(self) -> list[str]:
        return [
            f"{c.get('body', '')}\n{html_text(c.get('formatted_body', ''))}"
            for c in self._contents()
        ]

    def balanced(self) -> bool:
        return all(
            c.get("formatted_body", "").count("<pre>")
            == c.get("formatted_body", "").count("</pre>")
            for c in self._contents()
        )

    async def prompt(self) -> Shown:
        owner, _ = self.people

        def new_prompt() -> tuple[str, str] | None:
            for event_id, body in owner.received_events(self.room_id, self.account.user_id):
                if "❌ to deny" in body and event_id not in self._prompted:
                    return event_id, body
            return None

        event_id, body = await eventually(new_prompt, timeout=15, what="an approval prompt")
        self._prompted.add(event_id)
        return Shown(text=body, buttons=False, handle=event_id)

    async def decide(self, shown: Shown, *, approve: bool, approver: bool = True) -> str:
        owner, friend = self.people
        person = owner if approver else friend
        before = len(self.received())
        # The owner reacts as Element does (encrypted), the friend as nio does (clear).
        await person.react(
            self.room_id, shown.handle, "✅" if approve else "❌", encrypted=approver
        )
        if approver:
            return ""

        def refusal() -> str | None:
            return next((t for t in self.received()[before:] if t.startswith("⚠️")), None)

        return await eventually(refusal, timeout=15, what="the refusal in the room")

    def rate_limit_next(self) -> None:
        """The bot's burst of messages used up on the paced homeserver (messages sent
        as the bot until one is refused): its next send is answered M_LIMIT_EXCEEDED
        (retry after at most 5 s)."""
        from tests.matrix_people import use_up_messages

        use_up_messages(self.server.url, self.account)

    def rate_limited(self) -> int:
        assert self.bot is not None
        channel = next(c for c in self.bot.daemon.channels if c.name == "matrix")
        return int(cast(int, channel.health().get("rate_limited", 0)))


# -- Slack ----------------------------------------------------------------------------------
SLACK_OWNER, SLACK_FRIEND = "U0OWNER", "U0FRIEND"
SLACK_DM = "D0OWNER"  # the owner's direct messages with the bot


def slack_shown(message: dict[str, Any]) -> str:
    """A message as a person reads it in Slack: its blocks' texts (else its text), the
    code fences and Slack's escapes undone."""
    texts = [
        block["text"]["text"]
        for block in message.get("blocks") or []
        if block.get("type") == "section" and isinstance(block.get("text"), dict)
    ] or [str(message.get("text") or "")]
    text = "\n".join(t.strip("`").strip("\n") if t.startswith("```") else t for t in texts)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


SLACK_LINK = re.compile(r"<([^<>|]*)\|([^<>]*)>|<([^<>|]*)>")


def slack_read(message: dict[str, Any]) -> str:
    """A message as a person reads it in Slack: each link as its text, escapes undone,
    and (a second reading) any emphasis marks gone."""
    text = str(message.get("text") or "")
    text = SLACK_LINK.sub(lambda m: m.group(2) if m.group(3) is None else m.group(3), text)
    text = text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    return f"{text}\n{re.sub(r'[*_~`]', '', text)}"


class SlackDriver(Driver):
    """A fake Slack at the HTTP and WebSocket boundary (tests/fakes/slack_api.py) that the
    real slack-sdk talks to: the bot in Socket Mode; the owner (an approver) and a
    friend (allowed to chat, not an approver) write to it in direct messages."""

    NAME = "slack"
    PREFIX = "!"  # Slack takes /commands as its own
    LIMIT = 3_900  # Slack advises 4,000 characters
    ACK = "the Socket Mode envelope is acknowledged on the WebSocket (after the inbox commit)"

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.slack: Any = None
        self.api_base = ""  # the fake's, or the proxy's in front of it
        self.slack_keys = ""  # more keys of the [slack] section (TOML)
        self.extra = ""  # more config (TOML) for the daemon
        self.brain: Any = ContractBrain()
        self._prompted: set[str] = set()

    @contextlib.asynccontextmanager
    async def peer(self) -> AsyncIterator[None]:
        from tests.fakes.slack_api import FakeSlack

        async with FakeSlack() as slack, self._proxy(slack.base_url) as url:
            self.slack, self.api_base = slack, url
            if self.proxy is not None:
                slack.socket_origin = self.proxy.origin
            yield

    def config(self) -> str:
        return f"""
[slack]
enabled = true
api_base = "{self.api_base}"
allowed_users = ["{SLACK_OWNER}", "{SLACK_FRIEND}"]
approvers = ["{SLACK_OWNER}"]
{self.slack_keys}
{TOOLS}{self.extra}"""

    def environ(self) -> dict[str, str]:
        return {"SLACK_BOT_TOKEN": self.slack.bot_token, "SLACK_APP_TOKEN": self.slack.app_token,
                **SECRET_ENV}  # fmt: skip

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bot]:
        connections = self.slack.connections
        async with running_bot(
            self.state_dir, self.config(), environ=self.environ(), channels=["slack"],
            brain=self.brain,
        ) as bot:  # fmt: skip
            self.bot = bot
            if self.proxy is None or self.proxy.up:  # else it connects once the peer is back
                await eventually(lambda: self.slack.connections > connections, timeout=10,
                                 what="the bot's Socket Mode connection")  # fmt: skip
            yield bot

    async def say(self, text: str) -> Any:
        return await self.slack.push_message(text, user=SLACK_OWNER, channel=SLACK_DM)

    async def acknowledged(self, token: Any) -> None:
        # Any delivery of the event: one sent as a connection went is sent again.
        await self.slack.wait_acked(token, timeout=15, any_delivery=True)

    def sent(self, channel: str = SLACK_DM) -> list[dict[str, Any]]:
        return list(self.slack.messages.get(channel, []))

    def received(self) -> list[str]:
        return [slack_shown(m) for m in self.sent()]

    def displayed(self) -> list[str]:
        return [slack_read(m) for m in self.sent()]

    def balanced(self) -> bool:
        return all(str(m.get("text") or "").count("```") % 2 == 0 for m in self.sent())

    async def prompt(self) -> Shown:
        def new_prompt() -> dict[str, Any] | None:
            for message in self.sent():
                actions = [b for b in message.get("blocks") or [] if b.get("type") == "actions"]
                if actions and message["ts"] not in self._prompted:
                    return message
            return None

        message = await eventually(new_prompt, timeout=15, what="an approval prompt")
        self._prompted.add(message["ts"])
        [actions] = [b for b in message["blocks"] if b.get("type") == "actions"]
        ids = [e["action_id"] for e in actions["elements"]]
        return Shown(text=slack_shown(message), buttons=bool(ids), handle=(message["ts"], ids))

    async def decide(self, shown: Shown, *, approve: bool, approver: bool = True) -> str:
        ts, ids = shown.handle
        verb = "approve_once:" if approve else "deny:"
        action = next(a for a in ids if a.startswith(verb))
        before = len(self.received())
        envelope = await self.slack.push_action(
            channel=SLACK_DM, message_ts=ts, action_id=action, value=action,
            user=SLACK_OWNER if approver else SLACK_FRIEND,
        )  # fmt: skip
        await self.slack.wait_acked(envelope, timeout=15)
        if approver:
            return ""

        def refusal() -> str | None:
            return next((t for t in self.received()[before:] if t.startswith("⚠️")), None)

        return await eventually(refusal, timeout=15, what="the refusal in the conversation")

    def rate_limit_next(self) -> None:
        self.slack.fail_next("chat.postMessage", status=429, retry_after=1)

    def rate_limited(self) -> int:
        return sum(1 for c in self.slack.calls_to("chat.postMessage") if c.status == 429)


class SlackHttpDriver(SlackDriver):
    """The same fake Slack, the bot in HTTP mode: Slack's signed POSTs (events as JSON,
    button presses as a form) go to the daemon's ``/slack/events``."""

    ACK = "the signed POST to /slack/events is answered 200 (only after the inbox commit)"

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self._ts = 0

    def config(self) -> str:
        return "[http]\nport = 0\n" + super().config().replace(
            "enabled = true\n", 'enabled = true\nmode = "http"\n', 1
        )

    def environ(self) -> dict[str, str]:
        return {"SLACK_BOT_TOKEN": self.slack.bot_token,
                "SLACK_SIGNING_SECRET": self.slack.signing_secret, **SECRET_ENV}  # fmt: skip

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bot]:
        async with running_bot(
            self.state_dir, self.config(), environ=self.environ(), channels=["slack"],
            brain=self.brain,
        ) as bot:  # fmt: skip
            self.bot = bot
            yield bot

    def next_ts(self) -> str:
        self._ts += 1
        return f"1800000000.{self._ts:06d}"

    async def post(self, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
        """A POST to the daemon as Slack makes it (signed unless ``headers`` are given)."""
        import aiohttp

        assert self.bot is not None and self.bot.daemon.http is not None
        url = f"http://127.0.0.1:{self.bot.daemon.http.port}/slack/events"
        sent = self.slack.signed_headers(body) if headers is None else headers
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=body, headers=sent) as response,
        ):
            return response.status, await response.text()

    async def say(self, text: str) -> Any:
        """Slack's POST of the event; sent again while it is answered 503, as Slack does
        (here every 0.5 s, not Slack's 1 min and 5 min)."""
        event = {"type": "message", "channel": SLACK_DM, "user": SLACK_OWNER, "text": text,
                 "ts": self.next_ts(), "channel_type": "im"}  # fmt: skip
        body = self.slack.event_body(event)
        status, answer = await self.post(body)
        for retry in range(1, 61):
            if status != 503:
                break
            await asyncio.sleep(0.5)
            headers = {**self.slack.signed_headers(body), "X-Slack-Retry-Num": str(retry),
                       "X-Slack-Retry-Reason": "http_error"}  # fmt: skip
            status, answer = await self.post(body, headers)
        assert status == 200, answer
        return status

    async def acknowledged(self, token: Any) -> None:
        assert token == 200  # say() returned once the POST was answered: after the commit

    async def decide(self, shown: Shown, *, approve: bool, approver: bool = True) -> str:
        ts, ids = shown.handle
        verb = "approve_once:" if approve else "deny:"
        action = next(a for a in ids if a.startswith(verb))
        before = len(self.received())
        body = self.slack.action_body(
            channel=SLACK_DM, message_ts=ts, action_id=action, value=action,
            user=SLACK_OWNER if approver else SLACK_FRIEND,
        )  # fmt: skip
        status, answer = await self.post(body)
        assert status == 200, answer
        if approver:
            return ""

        def refusal() -> str | None:
            return next((t for t in self.received()[before:] if t.startswith("⚠️")), None)

        return await eventually(refusal, timeout=15, what="the refusal in the conversation")


# -- Pigeon: the channel plugin defined only in the tests (tests/plugin/) ----------------
PIGEON_OWNER, PIGEON_FRIEND = "owner", "friend"


class PigeonDriver(Driver):
    """The test plugin (tests/plugin/pigeon) against its fake server
    (tests/fakes/pigeon_api.py): the owner (an approver) and a friend (allowed to chat,
    not an approver) write to the bot in their own chats."""

    NAME = "pigeon"
    ACK = "/updates is polled with ``after`` past the update (stored in the inbox first)"
    LIMIT = 2_000

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.api: Any = None
        self.api_base = ""
        self._prompted: set[int] = set()

    @contextlib.asynccontextmanager
    async def peer(self) -> AsyncIterator[None]:
        from tests.fakes.pigeon_api import FakePigeon

        async with FakePigeon() as api, self._proxy(api.base_url) as url:
            self.api, self.api_base = api, url
            yield

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bot]:
        config = f"""
[pigeon]
enabled = true
api_base = "{self.api_base}"
allowed_users = ["{PIGEON_OWNER}", "{PIGEON_FRIEND}"]
approvers = ["{PIGEON_OWNER}"]
{TOOLS}"""
        environ = {"PIGEON_TOKEN": self.api.token, **SECRET_ENV}
        async with running_bot(
            self.state_dir, config, environ=environ, channels=["pigeon"], brain=ContractBrain()
        ) as bot:
            self.bot = bot
            yield bot

    async def say(self, text: str) -> Any:
        return self.api.push_message(text, user=PIGEON_OWNER)

    async def acknowledged(self, token: Any) -> None:
        await eventually(lambda: any(after >= token for after in self.api.polled_after),
                         timeout=15, what="a poll past the update")  # fmt: skip

    def received(self) -> list[str]:
        return cast(list[str], self.api.texts_to(PIGEON_OWNER))

    async def prompt(self) -> Shown:
        def new_prompt() -> Any:
            return next((m for m in self.api.sent
                         if m.buttons and m.chat == PIGEON_OWNER and m.id not in self._prompted),
                        None)  # fmt: skip

        message = await eventually(new_prompt, timeout=15, what="an approval prompt")
        self._prompted.add(message.id)
        actions = [b["action"] for row in message.buttons for b in row]
        return Shown(text=message.text, buttons=bool(actions), handle=(message.id, actions))

    async def decide(self, shown: Shown, *, approve: bool, approver: bool = True) -> str:
        message_id, actions = shown.handle
        verb = "approve_once:" if approve else "deny:"
        action = next(a for a in actions if a.startswith(verb))
        before = len(self.received())
        self.api.push_press(message_id, action, PIGEON_OWNER if approver else PIGEON_FRIEND)
        if approver:
            return ""

        def refusal() -> str | None:
            return next((t for t in self.received()[before:] if t.startswith("⚠️")), None)

        return await eventually(refusal, timeout=15, what="the refusal in the chat")


# -- E-mail ---------------------------------------------------------------------------------
MAIL_CODE = re.compile(r"\b[A-Z2-7]{5}-[A-Z2-7]{5}\b")


def mail_text(mail: EmailMessage) -> str:
    """A mail's plain-text part, as a person reads it."""
    body = mail.get_body(preferencelist=("plain",))
    return str(body.get_content()).replace("\r\n", "\n").rstrip("\n") if body else ""


def mail_shown(mail: EmailMessage) -> str:
    """Both bodies as a mail client shows them (the HTML one read as text)."""
    from channels.html import shown_html

    html = mail.get_body(preferencelist=("html",))
    return mail_text(mail) + "\n" + (shown_html(str(html.get_content())) if html else "")


class EmailDriver(Driver):
    """Real servers on 127.0.0.1 (tests/mail_server.py): the owner (an approver) and a
    friend (allowed to chat, not an approver) mail the bot through the receiving SMTP
    server, logged in, so it vouches for them; the bot reads Dovecot over IMAP and
    sends through the same SMTP server. Approval prompts are answered by reply, with the
    code the prompt carries."""

    NAME = "email"
    ACK = "the mail is flagged $EchoBotTaken in the bot's mailbox (after its commit)"
    # A mail holds 100,000 characters (channels/email/formatting.py): the suite's long
    # reply fits in one; tests/channels/test_email.py splits a longer one.
    LIMIT = None
    FIXTURES = ("mail_servers",)

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.servers: MailServers | None = None
        self.proxies: list[TcpProxy] = []
        self.ports = (0, 0)
        self.bot_address = self.owner = self.friend = ""
        self._prompted: set[str] = set()
        self.extra = ""  # more of [email]
        self.security = PLAIN
        self.brain: ContractBrain = ContractBrain()
        self._box = "INBOX"
        self._thread: str | None = None  # the first ``say_on`` mail's Message-ID

    async def say_on(self, text: str) -> Any:
        if self._thread is None:
            self._thread = await self.say(text)
            return self._thread
        root = self._thread
        return await self.send(
            self.mail(text, Subject="Re: a question", In_Reply_To=root, References=root)
        )

    @contextlib.asynccontextmanager
    async def peer(self) -> AsyncIterator[None]:
        servers = self.servers = self.fixtures["mail_servers"]
        self.bot_address = servers.add_user("bot")[0]
        self.owner, self.friend = servers.add_user("owner")[0], servers.add_user("friend")[0]
        self.ports = (servers.imap_port, servers.smtp_port)
        async with contextlib.AsyncExitStack() as stack:
            if self.proxied:
                self.proxies = [await stack.enter_async_context(TcpProxy(p)) for p in self.ports]
                self.ports = (self.proxies[0].port, self.proxies[1].port)
            yield

    async def peer_away(self) -> None:
        for proxy in self.proxies:
            await proxy.cut()

    async def peer_back(self) -> None:
        for proxy in self.proxies:
            await proxy.restore()

    @property
    def section(self) -> str:
        assert self.servers is not None
        more = f'poll_every = "5s"\napprovers = ["{self.owner}"]\n{self.extra}'
        people = [self.owner, self.friend]
        return self.servers.section(
            self.bot_address, people, ports=self.ports, security=self.security, extra=more
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bot]:
        assert self.servers is not None
        environ = {"ECHO_BOT_EMAIL_PASSWORD": self.servers.passwords[self.bot_address],
                   **SECRET_ENV}  # fmt: skip
        async with running_bot(
            self.state_dir, self.section + TOOLS, environ=environ, channels=["email"],
            brain=self.brain,
        ) as bot:  # fmt: skip
            self.bot = bot
            yield bot

    def mail(self, text: str, *, sender: str | None = None, **headers: str) -> EmailMessage:
        mail = EmailMessage()
        mail["From"] = sender or self.owner
        mail["To"] = self.bot_address
        mail["Subject"] = headers.pop("Subject", "a question")
        mail["Message-ID"] = make_msgid(domain="example.org")
        for name, value in headers.items():
            mail[name.replace("_", "-")] = value
        mail.set_content(text)
        return mail

    async def say(self, text: str) -> Any:
        return await self.send(self.mail(text))

    async def send(self, mail: EmailMessage, *, login: str | None = None) -> str:
        """``mail`` through the receiving server, logged in as its sender (vouched
        for) unless ``login`` names another; its Message-ID."""
        assert self.servers is not None
        who = login or parseaddr(str(mail["From"]))[1]
        await asyncio.to_thread(self.servers.send, mail, login=who)
        return str(mail["Message-ID"])

    async def send_to_box(self, text: str, box: str = "Bot") -> str:
        """A mail from the owner, vouched for, put straight into the bot's ``box`` (a
        mailbox other than INBOX, where no server delivers)."""
        assert self.servers is not None
        mail = self.mail(text)
        stamp = f"Authentication-Results: {AUTH_SERV_ID}; dmarc=pass header.from=example.org"
        raw = stamp.encode() + b"\r\n" + bytes(mail)
        await asyncio.to_thread(self.servers.append, self.bot_address, box, raw)
        self._box = box
        return str(mail["Message-ID"])

    async def inbound_addresses(self) -> list[str]:
        """The address of every committed inbound of the channel, oldest first."""
        assert self.bot is not None

        def read(tx: Any) -> list[str]:
            rows = [tx.inbox.get(s.id) for s in tx.inbox.recent(self.NAME, limit=100)]
            return [str(r.message.address) for r in reversed(rows) if r is not None]

        return list(await self.bot.daemon.runtime.store.run(read))

    async def acknowledged(self, token: Any) -> None:
        assert self.servers is not None
        servers, address, box = self.servers, self.bot_address, self._box

        def taken() -> bool:
            return "$EchoBotTaken" in servers.flags_of(address, token, box)

        await eventually(taken, timeout=20, what=f"{token} flagged in the bot's mailbox")

    def mails(self, to: str | None = None) -> list[EmailMessage]:
        assert self.servers is not None
        return self.servers.inbox(to or self.owner)

    def received(self) -> list[str]:
        return [mail_text(m) for m in self.mails()]

    def displayed(self) -> list[str]:
        return [mail_shown(m) for m in self.mails()]

    async def prompt(self) -> Shown:
        def new_prompt() -> EmailMessage | None:
            return next((m for m in self.mails() if ".approval@" in str(m["Message-ID"])
                         and str(m["Message-ID"]) not in self._prompted), None)  # fmt: skip

        mail = await eventually(new_prompt, timeout=20, what="an approval prompt by mail")
        self._prompted.add(str(mail["Message-ID"]))
        return Shown(text=mail_text(mail), buttons=False, handle=mail)

    async def decide(self, shown: Shown, *, approve: bool, approver: bool = True) -> str:
        """A reply to the prompt with its code; by the friend (not an approver), with the
        owner's code read off the prompt (a forwarded prompt)."""
        prompt: EmailMessage = shown.handle
        code = MAIL_CODE.search(shown.text)
        assert code is not None, shown.text
        sender = self.owner if approver else self.friend
        answer = self.mail(
            f"{'approve' if approve else 'deny'} {code.group(0)}\n\n> {shown.text[:40]}",
            sender=sender, Subject=f"Re: {prompt['Subject']}",
            In_Reply_To=str(prompt["Message-ID"]), References=str(prompt["Message-ID"]),
        )  # fmt: skip
        before = len(self.mails(sender))
        await self.send(answer)
        if approver:
            return ""

        def refusal() -> str | None:
            return next((mail_text(m) for m in self.mails(sender)[before:]
                         if mail_text(m).startswith("⚠️")), None)  # fmt: skip

        return await eventually(refusal, timeout=20, what="the refusal by mail")

    def rate_limit_next(self) -> None:
        assert self.servers is not None
        self.servers.refuse_next(1, self.bot_address)

    def rate_limited(self) -> int:
        assert self.servers is not None
        return self.servers.refused


# -- Discord --------------------------------------------------------------------------------
DISCORD_FRIEND_ID = "1100000000000000002"
DISCORD_LINK = re.compile(r"(?<!\\)\[((?:\\.|[^\]\\])*)\]\(<?([^()\s<>]*)>?\)")


def discord_read(content: str) -> str:
    """A message as a person reads it in Discord: each link as its text, code fences
    gone, backslash escapes undone."""
    text = DISCORD_LINK.sub(lambda m: m.group(1), content)
    text = re.sub(r"```[A-Za-z0-9+#.-]*\n|\n?```", "", text).replace("\u2060", "")
    return re.sub(r"\\(.)", r"\1", text, flags=re.S)


def discord_displayed(content: str) -> str:
    """``discord_read``, and on a second line the same without any emphasis mark."""
    bare = re.sub(r"(?<!\\)[*_~`|]", "", content)
    return f"{discord_read(content)}\n{discord_read(bare)}"


class DiscordDriver(Driver):
    """A fake Discord at the HTTP and WebSocket boundary (tests/fakes/discord_api.py) that
    the real discord.py talks to through ``[discord] proxy``: the owner (an approver) and a
    friend (allowed to chat, not an approver) write to the bot in direct messages."""

    NAME = "discord"
    PREFIX = "!"  # Discord's client takes /commands as its own
    LIMIT = 2_000
    UNIT = "utf16"
    ACK = (
        "none at the gateway (Discord has none): a message is taken once committed, in"
        " order; one not committed is read back over REST after a new session"
    )

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.discord: Any = None
        self.proxy_url = ""  # the fake's CONNECT proxy, or the TCP proxy in front of it
        self.extra = ""  # more config (TOML) for the daemon
        self.keys = ""  # more keys of [discord]
        self.brain: Any = ContractBrain()
        self._prompted: set[str] = set()

    @contextlib.asynccontextmanager
    async def peer(self) -> AsyncIterator[None]:
        from tests.fakes.discord_api import FakeDiscord

        async with FakeDiscord() as fake, self._proxy(fake.proxy_url) as url:
            self.discord, self.proxy_url = fake, url
            yield

    def config(self) -> str:
        from tests.fakes.discord_api import OWNER_ID

        return f"""
[discord]
enabled = true
proxy = "{self.proxy_url}"
ca_file = "{self.discord.ca_file}"
allowed_users = ["{OWNER_ID}", "{DISCORD_FRIEND_ID}"]
approvers = ["{OWNER_ID}"]
{self.keys}
{TOOLS}{self.extra}"""

    def environ(self) -> dict[str, str]:
        return {"DISCORD_BOT_TOKEN": self.discord.token, **SECRET_ENV}

    @contextlib.asynccontextmanager
    async def running(self, connected: bool = True) -> AsyncIterator[Bot]:
        """The daemon, once its gateway session is made (``connected``; else at once)."""
        fake = self.discord
        sessions = fake.identified + fake.resumed
        async with running_bot(
            self.state_dir, self.config(), environ=self.environ(), channels=["discord"],
            brain=self.brain,
        ) as bot:  # fmt: skip
            self.bot = bot
            if connected and (self.proxy is None or self.proxy.up):  # else: once it is back
                await eventually(lambda: fake.identified + fake.resumed > sessions, timeout=15,
                                 what="the bot's gateway session")  # fmt: skip
            yield bot

    def person(self, friend: bool = False) -> dict[str, Any]:
        from tests.fakes.discord_api import OWNER_ID, user

        return user(DISCORD_FRIEND_ID, "friend") if friend else user(OWNER_ID, "owner")

    def dm(self) -> str:
        from tests.fakes.discord_api import OWNER_ID, dm_of

        return dm_of(OWNER_ID)

    async def say(self, text: str) -> Any:
        return await self.discord.push_message(text, author=self.person(), channel_id=self.dm())

    async def acknowledged(self, token: Any) -> None:
        async def committed() -> bool:
            return sum(token["content"] in t for t in await self.inbound_texts()) > 0

        await eventually(committed, timeout=20, what=f"{token['content']!r} committed")

    def sent(self, channel: str | None = None) -> list[Any]:
        where = channel or self.dm()
        return [s for s in self.discord.sent if s.channel_id == where and not s.deleted]

    def received(self) -> list[str]:
        return self.received_in(self.dm())

    def received_in(self, channel: str) -> list[str]:
        return [discord_read(s.content) for s in self.sent(channel)]

    def received_files(self) -> list[str]:
        return [data.decode() for s in self.sent() for _, data in s.files]

    def displayed(self) -> list[str]:
        return [discord_displayed(s.content) for s in self.sent()]

    def balanced(self) -> bool:
        return all(s.content.count("```") % 2 == 0 for s in self.sent())

    async def prompt(self) -> Shown:
        def new_prompt() -> Any:
            return next(
                (s for s in self.sent() if s.components and s.id not in self._prompted), None
            )

        sent = await eventually(new_prompt, timeout=15, what="an approval prompt")
        self._prompted.add(sent.id)
        ids = [b["custom_id"] for row in sent.components for b in row["components"]]
        return Shown(text=discord_read(sent.content), buttons=bool(ids), handle=(sent, ids))

    async def decide(self, shown: Shown, *, approve: bool, approver: bool = True) -> str:
        sent, ids = shown.handle
        verb = "approve_once:" if approve else "deny:"
        action = next(a for a in ids if a.startswith(verb))
        before = len(self.received())
        pressed = await self.discord.press(sent, action, by=self.person(friend=not approver))
        await eventually(lambda: any(i == pressed for i, _ in self.discord.callbacks),
                         timeout=15, what="the press acknowledged")  # fmt: skip
        if approver:
            return ""

        def refusal() -> str | None:
            return next((t for t in self.received()[before:] if t.startswith("⚠️")), None)

        return await eventually(refusal, timeout=15, what="the refusal in the conversation")

    async def wait_received(self, *texts: str) -> list[str]:
        """As every driver's, with more time: Discord takes 5 messages per 5 s in a
        channel, and the suite's longest reply is 30 messages of 2,000 characters."""

        def arrived() -> bool:
            got = self.all_received()
            return all(any(t in g for g in got) for t in texts)

        await eventually(arrived, timeout=60, what=f"{texts} at the discord peer")
        return self.all_received()

    def rate_limit_next(self) -> None:
        self.discord.rate_limit_next("POST /channels/{id}/messages", retry_after=1.0)

    def rate_limited(self) -> int:
        return sum(1 for c in self.discord.calls_to("POST /channels/{id}/messages")
                   if c.status == 429)  # fmt: skip


DRIVERS: dict[str, type[Driver]] = {
    "discord": DiscordDriver,
    "email": EmailDriver,
    "pigeon": PigeonDriver,
    "matrix": MatrixDriver,
    "slack": SlackDriver,
    "slack-http": SlackHttpDriver,
    "telegram": TelegramDriver,
    "webhook": WebhookDriver,
    "cli": CliDriver,
}
