"""Soak test: a running `echo-bot run` under mixed load, SIGKILLed and restarted at random.

The daemon is a real subprocess (``python -m echo_bot run``) with Telegram pointed at a
fake Bot API server on 127.0.0.1 (started here), one signed webhook route and the shell
tool switched on. While it runs, seeded random load goes in:

* Telegram messages from a few allowed users: ``what time is it? [token]``;
* reminders: ``/tool reminder_create {"text": token, "when": "in N seconds"}``;
* approvals: ``/tool shell_exec {"argv": ["sh", "-c", "echo token >> effects.txt"]}``,
  whose prompt is pressed ("Approve once") a moment after it shows up;
* signed webhook deliveries (GitHub HMAC) on a route that calls ``reminder_create`` with
  the delivery's unique text and delivers to a Telegram chat — so every delivery has an
  attributable reply and sets a reminder that falls due during the run.

Meanwhile the daemon is SIGKILLed at random moments (some during start-up) and started
again. After a final restart and a drain, the checks read what the fake peers saw and the
store (see ``analyse``) and print a table of counts. ``bench/README.md`` explains how
duplicates are told apart.

    python bench/soak.py --kills 20 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import random
import signal
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402
from echo_bot.cli.webhook_client import sign_headers  # noqa: E402
from echo_bot.scheduling.scheduler import LATE_NOTE_AFTER  # noqa: E402
from tests.fakes.telegram_api import Call, FakeTelegramAPI  # noqa: E402

TOKEN = "123456:SOAK-test-token"
SECRET = "soak-webhook-secret"
SECRET_ENV = "SOAK_WEBHOOK_SECRET"
ROUTE = "soak"
FIRST_USER = 101
WEBHOOK_CHAT = 900
DB_FILENAME = "echo-bot.sqlite3"
TERMINAL = ("done", "failed", "denied", "expired")
UNKNOWN = "OUTCOME_UNKNOWN"
SPAWN_GRACE = 0.25  # seconds: no daemon sends anything this soon after its spawn


@dataclass
class SoakConfig:
    """Every knob of a run. The defaults are the long run (``--kills 20``)."""

    seed: int = 1
    kills: int = 20
    users: int = 4  # private chats sending load (each paced at ~1 message/s by the bot)
    messages: int = 100  # "what time is it?" messages
    reminders: int = 24  # reminders set from Telegram
    webhooks: int = 30  # signed deliveries (each also sets a reminder)
    approvals: int = 16  # shell_exec calls approved by a button press
    min_up: float = 0.5  # seconds the daemon runs after it is ready, before a kill
    max_up: float = 4.0
    max_down: float = 1.0  # seconds it stays down after a kill
    startup_kill_chance: float = 0.2  # share of kills that land during start-up
    late_outage: float = 65.0  # one outage this long (0: none), so reminders come late
    min_reminder_delay: int = 3  # reminders are due "in N seconds", N in this range
    max_reminder_delay: int = 15
    # The fake Bot API answers each sendMessage this late (the message is already shown):
    # the window in which a kill leaves a delivered send unconfirmed.
    send_latency: float = 0.3
    press_delay: float = 3.0  # an approval prompt is pressed within this many seconds
    drain_timeout: float = 150.0  # after the last restart, wait this long for all to finish
    quiet: float = 3.0  # then this long for late duplicates to show up
    start_timeout: float = 60.0  # one daemon start-up, at most
    max_seconds: float = 600.0  # the whole run, at most


# ---------------------------------------------------------------------------------------
# The daemon, as a subprocess that is killed and started again
# ---------------------------------------------------------------------------------------


@dataclass
class Incarnation:
    """One daemon process: when it was spawned, became ready and was killed."""

    index: int
    pid: int
    spawn_mono: float
    ready_mono: float | None = None
    kill_mono: float | None = None
    kill_wall: float | None = None
    during_startup: bool = False
    returncode: int | None = None


def daemon_env() -> dict[str, str]:
    """A clean environment: no tokens or keys leak in from outside."""
    keep = {"PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "VIRTUAL_ENV", "TMPDIR"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update({"PYTHONUNBUFFERED": "1", "TELEGRAM_BOT_TOKEN": TOKEN, SECRET_ENV: SECRET})
    return env


class DaemonProcess:
    """``echo-bot run`` started, killed (SIGKILL) and started again; stderr goes to a
    file per incarnation (never a pipe: a full pipe would block the daemon)."""

    def __init__(self, config: Path, state_dir: Path, log_dir: Path) -> None:
        self.config = config
        self.state_dir = state_dir
        self.log_dir = log_dir
        self.incarnations: list[Incarnation] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._log: TextIO | None = None
        self._log_path: Path | None = None

    @property
    def current(self) -> Incarnation:
        return self.incarnations[-1]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def spawn(self) -> Incarnation:
        assert not self.running, "one daemon at a time"
        index = len(self.incarnations)
        self._log_path = self.log_dir / f"daemon-{index:02d}.log"
        self._log = self._log_path.open("w")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "echo_bot", "run",
            "--config", str(self.config), "--state-dir", str(self.state_dir),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=self._log,
            env=daemon_env(),
            cwd=ROOT,
        )  # fmt: skip
        inc = Incarnation(index=index, pid=self.proc.pid, spawn_mono=time.monotonic())
        self.incarnations.append(inc)
        return inc

    def log_tail(self, lines: int = 20) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        return "\n".join(self._log_path.read_text(errors="replace").splitlines()[-lines:])

    async def wait_ready(self, timeout: float) -> None:
        """Until the banner's "stop with" line (printed once every channel started)."""
        assert self.proc is not None and self._log_path is not None
        inc = self.current
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self._log_path.read_text(errors="replace")
            if any(line.startswith("stop with") for line in text.splitlines()):
                inc.ready_mono = time.monotonic()
                return
            if self.proc.returncode is not None:
                raise RuntimeError(
                    f"daemon {inc.index} exited with {self.proc.returncode} before it was "
                    f"ready:\n{self.log_tail()}"
                )
            await asyncio.sleep(0.05)
        raise RuntimeError(f"daemon {inc.index} not ready within {timeout} s:\n{self.log_tail()}")

    async def kill(self) -> None:
        """SIGKILL, at whatever it is doing."""
        assert self.proc is not None
        inc = self.current
        inc.during_startup = inc.ready_mono is None
        inc.kill_mono, inc.kill_wall = time.monotonic(), time.time()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        inc.returncode = await self.proc.wait()
        self._close_log()

    async def terminate(self, timeout: float = 30.0) -> int | None:
        """SIGTERM and wait for a clean exit; SIGKILL when it does not come in time."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                await self.kill()
                self.current.returncode = None
                return None
        self.current.returncode = self.proc.returncode
        self._close_log()
        return self.proc.returncode

    def ensure_dead(self) -> None:
        """Synchronous last resort (finally blocks): the subprocess never outlives us."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def write_config(path: Path, api_base: str, users: list[int], port: int) -> None:
    path.write_text(
        f"""
[bot]
log_level = "INFO"
shutdown_timeout = "5s"

[telegram]
enabled = true
api_base = "{api_base}"
allowed_users = {json.dumps(users)}

[http]
host = "127.0.0.1"
port = {port}

[webhook]
enabled = true

[[webhook.routes]]
name = "{ROUTE}"
auth = "github"
secret_env = "{SECRET_ENV}"
rate_limit = 100000
deliver_to = "telegram:{WEBHOOK_CHAT}"
tool = "reminder_create"
args = {{ text = "{{payload[text]}}", when = "{{payload[when]}}" }}

[tools]
profile = "coding"

[tools.shell]
enabled = true
"""
    )


# ---------------------------------------------------------------------------------------
# The load
# ---------------------------------------------------------------------------------------


@dataclass
class TgMessage:
    kind: str  # "ask" | "remind" | "approve"
    token: str
    chat: int
    text: str
    update_id: int
    message_id: int


@dataclass
class Delivery:
    token: str
    body: bytes
    attempts: int = 0
    accepted: bool = False
    inbound_id: str | None = None
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    in_flight: bool = False
    next_try: float = 0.0


@dataclass
class Press:
    token: str
    chat: int
    prompt_message_id: int
    data: str
    at: float
    pushed: bool = False


@dataclass
class Load:
    messages: list[TgMessage] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    presses: dict[str, Press] = field(default_factory=dict)  # approval token → press


class LoadDriver:
    """Sends the seeded mix of work, retries webhook deliveries like a real sender, and
    presses every approval prompt once."""

    def __init__(self, cfg: SoakConfig, api: FakeTelegramAPI, hook_url: str) -> None:
        self.cfg = cfg
        self.api = api
        self.hook_url = hook_url
        self.rng = random.Random(cfg.seed)
        self.press_rng = random.Random(cfg.seed * 7919 + 1)
        self.load = Load()
        self.users = [FIRST_USER + i for i in range(cfg.users)]
        self.approval_chat: dict[str, int] = {}
        self._scanned = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.http: Any = None

    def plan(self) -> list[str]:
        cfg = self.cfg
        kinds = (
            ["ask"] * cfg.messages
            + ["remind"] * cfg.reminders
            + ["approve"] * cfg.approvals
            + ["webhook"] * cfg.webhooks
        )
        self.rng.shuffle(kinds)
        return kinds

    async def generate(self, spread: float, deadline: float) -> None:
        """Send the whole plan over about ``spread`` seconds."""
        kinds = self.plan()
        base = spread / max(1, len(kinds))
        counters: collections.Counter[str] = collections.Counter()
        for kind in kinds:
            if time.monotonic() > deadline:
                break
            counters[kind] += 1
            token = f"{kind[:2]}-{self.cfg.seed}-{counters[kind]:04d}"
            if kind == "webhook":
                self._add_delivery(token)
            else:
                self._push(kind, token, self.rng.choice(self.users))
            await asyncio.sleep(base * self.rng.uniform(0.3, 1.7))

    def _delay(self) -> int:
        return self.rng.randint(self.cfg.min_reminder_delay, self.cfg.max_reminder_delay)

    def _push(self, kind: str, token: str, chat: int, delay: int | None = None) -> None:
        if kind == "ask":
            text = f"what time is it? [{token}]"
        elif kind == "remind":
            args = {"text": token, "when": f"in {delay or self._delay()} seconds"}
            text = f"/tool reminder_create {json.dumps(args)}"
        else:
            args = {"argv": ["sh", "-c", f"echo {token} >> effects.txt"]}
            text = f"/tool shell_exec {json.dumps(args)}"
            self.approval_chat[token] = chat
        update_id = self.api.push_message(text, user_id=chat)
        message_id = self.api.pushed_updates[-1]["message"]["message_id"]
        self.load.messages.append(TgMessage(kind, token, chat, text, update_id, message_id))

    async def plant_late_reminder(self, db_path: Path, timeout: float) -> None:
        """A reminder due 3 s from now; returns as soon as the store has it, so that the
        long outage that follows begins before it is due: it must arrive marked late."""
        token = f"la-{self.cfg.seed}-0001"
        self._push("remind", token, self.users[0], delay=3)
        end = time.monotonic() + timeout
        for _ in range(int(timeout / 0.05) + 1):  # polls the store: another process
            if time.monotonic() > end or await asyncio.to_thread(_has_reminder, db_path, token):
                return
            await asyncio.sleep(0.05)

    def _add_delivery(self, token: str) -> None:
        payload = {"text": token, "when": f"in {self._delay()} seconds", "id": token}
        delivery = Delivery(token=token, body=json.dumps(payload).encode())
        self.load.deliveries.append(delivery)
        self._send(delivery)

    # -- webhook deliveries, retried until accepted (as GitHub or Svix would) ------------
    def _send(self, delivery: Delivery) -> None:
        delivery.in_flight = True
        delivery.attempts += 1
        task = asyncio.create_task(self._post(delivery))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _post(self, delivery: Delivery) -> None:
        from aiohttp import ClientError

        try:
            headers = sign_headers("github", SECRET, delivery.body, "push")
            async with self.http.post(self.hook_url, data=delivery.body, headers=headers) as r:
                body = await r.json(content_type=None)
                answer = f"{r.status} {body.get('status')}"
                if r.status == 202 or (r.status == 200 and body.get("status") == "duplicate"):
                    delivery.accepted = True
                    delivery.inbound_id = body.get("id")
        except (ClientError, OSError, TimeoutError, ValueError) as exc:
            answer = type(exc).__name__
        finally:
            delivery.in_flight = False
            delivery.next_try = time.monotonic() + 0.5
        delivery.answers[answer] += 1

    async def retry_deliveries(self, stop: asyncio.Event, deadline: float) -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            now = time.monotonic()
            for delivery in self.load.deliveries:
                if (
                    not delivery.accepted
                    and not delivery.in_flight
                    and delivery.next_try <= now
                    and delivery.attempts < 1000
                ):
                    self._send(delivery)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    # -- approval prompts, each pressed once -----------------------------------------------
    async def press_approvals(self, stop: asyncio.Event, deadline: float) -> None:
        while not stop.is_set() and time.monotonic() < deadline:
            self._scan_prompts()
            now = time.monotonic()
            for press in self.load.presses.values():
                if not press.pushed and press.at <= now:
                    self.api.push_callback(
                        press.data,
                        user_id=press.chat,
                        message_id=press.prompt_message_id,
                        chat_id=press.chat,
                    )
                    press.pushed = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)

    def _scan_prompts(self) -> None:
        calls = self.api.calls
        end = len(calls)
        for call in calls[self._scanned : end]:
            if call.method != "sendMessage" or call.status is None:
                continue  # not answered yet: look again next time
            if call.ok and "reply_markup" in call.params:
                self._prompt_seen(call)
        # Keep unanswered calls for the next scan.
        pending = [i for i in range(self._scanned, end) if calls[i].status is None]
        self._scanned = pending[0] if pending else end

    def _prompt_seen(self, call: Call) -> None:
        text = str(call.params.get("text", ""))
        token = next((t for t in self.approval_chat if f"echo {t} " in text), None)
        if token is None or token in self.load.presses:
            return  # not ours, or pressed already (a repeated prompt is not pressed again)
        markup = call.params["reply_markup"]
        markup = json.loads(markup) if isinstance(markup, str) else markup
        data = markup["inline_keyboard"][0][0]["callback_data"]
        if not data.startswith("approve_once:"):
            return
        assert call.response is not None
        self.load.presses[token] = Press(
            token=token,
            chat=self.approval_chat[token],
            prompt_message_id=int(call.response["result"]["message_id"]),
            data=data,
            at=time.monotonic() + self.press_rng.uniform(0.1, self.cfg.press_delay),
        )

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# ---------------------------------------------------------------------------------------
# Reading the store
# ---------------------------------------------------------------------------------------


@dataclass
class OutRow:
    seq: int
    id: str
    chat_key: str
    status: str
    finished_at: float | None
    payload: dict[str, Any]
    receipt: str | None  # the channel's message id of the delivered copy

    @property
    def text(self) -> str:
        return str(self.payload.get("text", ""))

    @property
    def reply_to(self) -> str | None:
        return self.payload.get("quote")

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.payload.get("metadata") or {})


@dataclass
class Store:
    outbox: list[OutRow]
    inbox: list[dict[str, Any]]
    reminders: list[dict[str, Any]]
    fires: list[dict[str, Any]]
    approvals: list[dict[str, Any]]
    integrity: str


def read_store(path: Path, integrity: bool = False) -> Store:
    conn = sqlite3.connect(path, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        outbox = [
            OutRow(
                seq=r["seq"],
                id=r["id"],
                chat_key=r["chat_key"],
                status=r["status"],
                finished_at=r["finished_at"],
                payload=json.loads(r["payload"]),
                receipt=r["channel_message_id"],
            )
            for r in conn.execute(
                "SELECT o.seq, o.id, o.chat_key, o.status, o.finished_at, o.payload,"
                " r.channel_message_id FROM outbox o LEFT JOIN receipts r"
                " ON r.outbound_id = o.id WHERE o.channel = 'telegram' ORDER BY o.seq"
            )
        ]
        inbox = [
            dict(r)
            for r in conn.execute(
                "SELECT id, kind, channel, external_id, status, error FROM inbox ORDER BY seq"
            )
        ]
        reminders = [dict(r) for r in conn.execute("SELECT * FROM reminders")]
        fires = [dict(r) for r in conn.execute("SELECT * FROM reminder_fires")]
        approvals = [dict(r) for r in conn.execute("SELECT id, tool, args, status FROM approvals")]
        check = "not run"
        if integrity:
            check = "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check"))
        return Store(outbox, inbox, reminders, fires, approvals, check)
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------
# What the fake Telegram saw, aligned with the outbox
# ---------------------------------------------------------------------------------------


@dataclass
class Sent:
    """One sendMessage the fake answered 200."""

    index: int
    at: float
    chat: int
    text: str
    reply_to: int | None
    message_id: int
    incarnation: int


@dataclass
class Copies:
    """The sendMessage calls that delivered one outbox row: ``final`` is the one its
    receipt names; ``extra`` are earlier copies of the same message."""

    row: OutRow
    final: Sent | None = None
    extra: list[Sent] = field(default_factory=list)


def sent_messages(api: FakeTelegramAPI, incarnations: list[Incarnation]) -> list[Sent]:
    spawns = [inc.spawn_mono for inc in incarnations]
    out: list[Sent] = []
    for index, call in enumerate(api.calls):
        if call.method != "sendMessage" or not call.ok or call.response is None:
            continue
        reply = call.params.get("reply_parameters")
        if isinstance(reply, str):
            reply = json.loads(reply)
        reply_to = reply.get("message_id") if isinstance(reply, dict) else None
        # The daemon that sent it: the newest one spawned before the fake saw the call.
        # A new one needs far longer than SPAWN_GRACE before it can send anything, while
        # a killed one's last request may still be read by the fake just after a respawn.
        incarnation = max(
            (i for i, t in enumerate(spawns) if t + SPAWN_GRACE <= call.at), default=0
        )
        out.append(
            Sent(
                index=index,
                at=call.at,
                chat=int(call.params["chat_id"]),
                text=str(call.params.get("text", "")),
                reply_to=None if reply_to is None else int(reply_to),
                message_id=int(call.response["result"]["message_id"]),
                incarnation=incarnation,
            )
        )
    return out


@dataclass
class Alignment:
    copies: dict[str, Copies]  # outbox id → its copies
    unattributed: list[Sent]  # 200-answered sends no outbox row explains
    out_of_order: list[str]


def align(rows: list[OutRow], sent: list[Sent]) -> Alignment:
    """Per chat, the outbox is delivered in seq order, one send in flight at a time. So
    the chat's sends read as: for each delivered row, zero or more repeats of it, then
    the copy its receipt names. Edits (editMessageText) are not sends and are left out."""
    copies = {row.id: Copies(row) for row in rows if not row.payload.get("edit_of")}
    by_chat: dict[str, list[OutRow]] = collections.defaultdict(list)
    for row in rows:
        if row.id in copies and row.status != "failed":
            by_chat[row.chat_key].append(row)
    unattributed: list[Sent] = []
    out_of_order: list[str] = []
    sends: dict[str, list[Sent]] = collections.defaultdict(list)
    for s in sent:
        sends[f"telegram:{s.chat}"].append(s)
    for chat_key, chat_sends in sends.items():
        queue = by_chat.get(chat_key, [])
        receipts = {row.receipt: row for row in queue if row.receipt is not None}
        k = 0
        for s in chat_sends:
            row = receipts.get(str(s.message_id))
            if row is not None:
                if k < len(queue) and queue[k].id == row.id:
                    k += 1
                else:
                    out_of_order.append(f"{chat_key}: outbound {row.id} delivered out of order")
                    k = queue.index(row) + 1
                copies[row.id].final = s
            elif k < len(queue) and _same(s, queue[k]):
                copies[queue[k].id].extra.append(s)
            else:
                unattributed.append(s)
    return Alignment(copies, unattributed, out_of_order)


def _same(s: Sent, row: OutRow) -> bool:
    reply_to = row.reply_to
    wanted = int(reply_to) if reply_to and reply_to.isdigit() else None
    return s.text == row.text and s.reply_to == wanted


@dataclass
class Duplicates:
    in_flight: int = 0
    otherwise: int = 0
    per_kill_chat: collections.Counter[tuple[int, str]] = field(default_factory=collections.Counter)
    otherwise_rows: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def judge_duplicates(copies: Iterable[Copies], incarnations: list[Incarnation]) -> Duplicates:
    """Each repeat of a row is "in flight" when the daemon that sent it was killed before
    the next copy went out, the row was not yet marked sent at that kill, and no other
    repeat in the same chat is charged to the same kill (one send in flight per chat).
    Any other repeat is "otherwise" — a bug."""
    dups = Duplicates()
    for item in copies:
        chain = [*item.extra, *([item.final] if item.final else [])]
        for first, following in itertools.pairwise(chain):
            inc = incarnations[first.incarnation]
            key = (first.incarnation, item.row.chat_key)
            in_flight = (
                first.incarnation < following.incarnation
                and inc.kill_wall is not None
                and (item.row.finished_at is None or item.row.finished_at > inc.kill_wall)
                and dups.per_kill_chat[key] == 0
            )
            if in_flight:
                dups.per_kill_chat[key] += 1
                dups.in_flight += 1
            else:
                dups.otherwise += 1
                dups.otherwise_rows.add(item.row.id)
                dups.violations.append(
                    f"duplicate not explained by a kill: {item.row.chat_key} "
                    f"{item.row.text[:60]!r} (daemons {first.incarnation}→"
                    f"{following.incarnation})"
                )
        if item.extra and item.final is None:
            dups.notes.append(f"outbound {item.row.id} repeated but never marked delivered")
    return dups


# ---------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------


@dataclass
class SoakResult:
    counts: dict[str, Any]
    violations: list[str]
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    seed: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def table(self) -> str:
        c = self.counts
        rows = [
            ("telegram messages sent", c["sent"], ""),
            ("  acknowledged (update confirmed)", c["acknowledged"], "= sent"),
            ("  answered", c["answered"], "= acknowledged"),
            ("lost", c["lost"], "must be 0"),
            ("duplicated in flight", c["dup_in_flight"], "≤ 1 per chat per kill"),
            ("duplicated otherwise", c["dup_otherwise"], "must be 0"),
            ("webhook deliveries sent", c["webhooks_sent"], ""),
            ("  accepted (202, or 200 duplicate on retry)", c["webhooks_accepted"], "= sent"),
            ("  finished (final state in the inbox)", c["webhooks_finished"], "= accepted"),
            ("  sender attempts refused while down", c["webhook_refusals"], ""),
            ("reminders set", c["reminders_set"], ""),
            ("  delivered", c["reminders_delivered"], "= set"),
            (f"  late (> {LATE_NOTE_AFTER:.0f} s, marked late)", c["reminders_late"], ""),
            ("  twice", c["reminders_twice"], "must be 0"),
            ("approvals pressed", c["approvals_pressed"], ""),
            ("  side effects (unique tokens)", c["effects"], "≤ pressed"),
            ("  side effects twice", c["effects_twice"], "must be 0"),
            ("  unknown outcomes (reported)", c["unknown_approvals"], ""),
            ("reminder requests with unknown outcome", c["unknown_reminders"], ""),
            ("outbox messages failed", c["outbox_failed"], "must be 0"),
            ("work left unfinished", c["stuck"], "must be 0"),
            ("kills (SIGKILL)", c["kills"], ""),
            ("  of which during start-up", c["kills_startup"], ""),
            ("final SIGTERM exit code", c["exit_code"], "0"),
            ("PRAGMA integrity_check", c["integrity"], "ok"),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [f"soak: seed {self.seed}, {c['kills']} kills, {self.seconds:.0f} s"]
        lines.append(f"{'':{width}}  {'count':>6}  rule")
        for name, value, rule in rows:
            lines.append(f"{name:{width}}  {value!s:>6}  {rule}".rstrip())
        lines.append("result: " + ("OK" if self.ok else f"FAILED ({len(self.violations)})"))
        lines += [f"  ✗ {v}" for v in self.violations[:40]]
        lines += [f"  · {n}" for n in self.notes[:40]]
        return "\n".join(lines)


def analyse(
    *,
    api: FakeTelegramAPI,
    load: Load,
    store: Store,
    incarnations: list[Incarnation],
    workspace: Path,
    exit_code: int | None,
    expect_late: bool = False,
) -> SoakResult:
    violations: list[str] = []
    notes: list[str] = []
    kills = [inc for inc in incarnations if inc.kill_mono is not None]
    sent = sent_messages(api, incarnations)
    alignment = align(store.outbox, sent)
    copies = alignment.copies
    violations += alignment.out_of_order

    # -- duplicates: every extra copy, judged against the kills --------------------------
    dups = judge_duplicates(copies.values(), incarnations)
    dup_in_flight, dup_otherwise = dups.in_flight, dups.otherwise
    per_kill_chat, otherwise_rows = dups.per_kill_chat, dups.otherwise_rows
    violations += dups.violations
    notes += dups.notes
    for s in alignment.unattributed:
        dup_otherwise += 1
        violations.append(f"a send no outbox row explains: chat {s.chat} {s.text[:60]!r}")

    # -- Telegram messages ------------------------------------------------------------------
    pending = {u["update_id"] for u in api.pending_updates}
    replies: dict[tuple[int, int], list[Sent]] = collections.defaultdict(list)
    for s in sent:
        if s.reply_to is not None:
            replies[(s.chat, s.reply_to)].append(s)
    rows_replying: dict[tuple[str, str], list[OutRow]] = collections.defaultdict(list)
    for row in store.outbox:
        if row.reply_to and not row.payload.get("edit_of"):
            rows_replying[(row.chat_key, row.reply_to)].append(row)
    acknowledged = answered = lost = 0
    unknown_approvals = unknown_reminders = 0
    reminder_ok: set[str] = set()
    approval_replies: dict[str, str] = {}
    for m in load.messages:
        if m.update_id in pending:
            violations.append(f"update {m.update_id} ({m.token}) never acknowledged")
            continue
        acknowledged += 1
        got = replies.get((m.chat, m.message_id), [])
        if not got:
            lost += 1
            violations.append(f"lost: {m.token} in chat {m.chat} got no reply")
            continue
        answered += 1
        produced = rows_replying.get((f"telegram:{m.chat}", str(m.message_id)), [])
        if len(produced) > 1:
            dup_otherwise += len(produced) - 1
            violations.append(f"{m.token}: {len(produced)} different replies were produced")
        text = got[-1].text
        if m.kind == "ask" and not text.startswith("It is "):
            violations.append(f"{m.token}: unexpected answer {text[:80]!r}")
        elif m.kind == "remind":
            if "OK, I will remind you" in text:
                reminder_ok.add(m.token)
            elif UNKNOWN in text:
                unknown_reminders += 1
            else:
                violations.append(f"{m.token}: reminder refused: {text[:100]!r}")
        elif m.kind == "approve":
            approval_replies[m.token] = text
            if UNKNOWN in text:
                unknown_approvals += 1

    # -- webhook deliveries -------------------------------------------------------------------
    inbox_by_id = {r["id"]: r for r in store.inbox}
    reply_rows: dict[str, list[OutRow]] = collections.defaultdict(list)
    for row in store.outbox:
        inbound = row.meta.get("inbound_id")
        if inbound and row.payload.get("kind") == "reply":
            reply_rows[str(inbound)].append(row)
    accepted = finished = 0
    for d in load.deliveries:
        if not d.accepted:
            violations.append(f"webhook {d.token} never accepted ({dict(d.answers)})")
            continue
        accepted += 1
        row = inbox_by_id.get(d.inbound_id or "")
        if row is None:
            lost += 1
            violations.append(f"lost: webhook {d.token} accepted as {d.inbound_id}, not in inbox")
            continue
        if row["status"] in TERMINAL:
            finished += 1
        else:
            violations.append(f"webhook {d.token} stuck in state {row['status']}")
        produced = reply_rows.get(row["id"], [])
        delivered = [r for r in produced if copies.get(r.id) and copies[r.id].final]
        if not delivered:
            lost += 1
            violations.append(f"lost: the reply to webhook {d.token} never reached Telegram")
            continue
        if len(produced) > 1:
            dup_otherwise += len(produced) - 1
            violations.append(f"webhook {d.token}: {len(produced)} replies were produced")
        text = delivered[-1].text
        if "OK, I will remind you" in text and d.token in text:
            reminder_ok.add(d.token)
        elif UNKNOWN in text:
            unknown_reminders += 1
        else:
            violations.append(f"webhook {d.token}: unexpected reply {text[:100]!r}")
    webhook_rows = [r for r in store.inbox if r["channel"] == "webhook"]
    if len(webhook_rows) > accepted:
        dup_otherwise += len(webhook_rows) - accepted
        violations.append(f"{len(webhook_rows)} webhook inbox rows for {accepted} deliveries")

    # -- reminders ----------------------------------------------------------------------------
    tokens = {m.token for m in load.messages if m.kind == "remind"}
    tokens |= {d.token for d in load.deliveries}
    ours = [r for r in store.reminders if r["text"] in tokens]
    by_text = collections.Counter(r["text"] for r in ours)
    for text, n in by_text.items():
        if n > 1:
            violations.append(f"reminder {text} created {n} times (a write tool ran twice)")
    for token in sorted(reminder_ok - set(by_text)):
        lost += 1
        violations.append(f"lost: reminder {token} confirmed but not stored")
    fires: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for fire in store.fires:
        fires[fire["reminder_id"]].append(fire)
    fire_rows: dict[str, list[OutRow]] = collections.defaultdict(list)
    for row in store.outbox:
        if row.payload.get("kind") == "reminder" and row.meta.get("reminder_id"):
            fire_rows[str(row.meta["reminder_id"])].append(row)
    delivered_reminders = late = twice = 0
    for r in ours:
        marks = fires.get(r["id"], [])
        produced = fire_rows.get(r["id"], [])
        if r["status"] != "done" or len(marks) != 1:
            violations.append(
                f"reminder {r['text']}: status {r['status']}, fired {len(marks)} time(s)"
            )
        if len(produced) > 1:
            twice += len(produced) - 1
            dup_otherwise += len(produced) - 1
            violations.append(f"reminder {r['text']} queued {len(produced)} times")
        done = [row for row in produced if copies.get(row.id) and copies[row.id].final]
        if not done:
            lost += 1
            violations.append(f"lost: reminder {r['text']} never reached Telegram")
            continue
        delivered_reminders += 1
        twice += sum(1 for row in produced if row.id in otherwise_rows)
        late_by = float(marks[0]["late_by"]) if marks else 0.0
        marked = "late by" in done[0].text
        if late_by > LATE_NOTE_AFTER:
            late += 1
        if marked != (late_by > LATE_NOTE_AFTER):
            violations.append(
                f"reminder {r['text']} was {late_by:.0f} s late; text {done[0].text[:80]!r}"
            )

    # -- approvals and their side effects ----------------------------------------------------
    effects_file = workspace / "effects.txt"
    lines = effects_file.read_text().split() if effects_file.exists() else []
    effects = collections.Counter(lines)
    approved_tokens = {t for t in load.presses if load.presses[t].pushed}
    effects_twice = sum(1 for n in effects.values() if n > 1)
    for token, n in effects.items():
        if n > 1:
            violations.append(f"side effect {token} happened {n} times")
        if token not in approved_tokens:
            violations.append(f"side effect {token} happened without an approval press")
    for token in approved_tokens:
        text = approval_replies.get(token)
        if text is None:
            continue  # counted as lost above
        if "exit code 0" in text and effects.get(token, 0) != 1:
            violations.append(f"{token}: reply says it ran, effects file says otherwise")
        elif UNKNOWN not in text and "exit code 0" not in text:
            violations.append(f"{token}: unexpected result {text[:100]!r}")
    shell_rows = [a for a in store.approvals if a["tool"] == "shell_exec"]
    pending_approvals = [a for a in shell_rows if a["status"] == "pending"]
    if len(shell_rows) != len(load.presses) or pending_approvals:
        violations.append(
            f"{len(shell_rows)} shell approvals stored, {len(load.presses)} prompts seen, "
            f"{len(pending_approvals)} still pending"
        )

    # -- unfinished work and the store ------------------------------------------------------
    queued = [r for r in store.outbox if r.status == "queued"]
    failed = [r for r in store.outbox if r.status == "failed"]
    unfinished = [r for r in store.inbox if r["status"] not in TERMINAL]
    stuck = len(queued) + len(unfinished)
    if queued:
        violations.append(f"{len(queued)} outbound message(s) still queued")
    if unfinished:
        violations.append(f"{len(unfinished)} inbound(s) unfinished: {unfinished[:3]}")
    for row in failed:
        violations.append(f"outbound {row.id} failed: {row.text[:60]!r}")
    if expect_late and not late:
        notes.append("no reminder came late: the late marking went unchecked this run")
    if store.integrity != "ok":
        violations.append(f"PRAGMA integrity_check: {store.integrity}")
    if exit_code != 0:
        violations.append(f"the final SIGTERM ended the daemon with {exit_code}, not 0")
    counts = {
        "sent": len(load.messages),
        "acknowledged": acknowledged,
        "answered": answered,
        "lost": lost,
        "dup_in_flight": dup_in_flight,
        "dup_otherwise": dup_otherwise,
        "webhooks_sent": len(load.deliveries),
        "webhooks_accepted": accepted,
        "webhooks_finished": finished,
        "webhook_refusals": sum(
            n for d in load.deliveries for a, n in d.answers.items() if not a[:1].isdigit()
        ),
        "reminders_set": len(ours),
        "reminders_delivered": delivered_reminders,
        "reminders_late": late,
        "reminders_twice": twice,
        "approvals_pressed": len(approved_tokens),
        "effects": len(effects),
        "effects_twice": effects_twice,
        "unknown_approvals": unknown_approvals,
        "unknown_reminders": unknown_reminders,
        "outbox_failed": len(failed),
        "stuck": stuck,
        "kills": len(kills),
        "kills_startup": sum(1 for k in kills if k.during_startup),
        "exit_code": exit_code,
        "integrity": store.integrity,
        "max_dups_per_kill": max(per_kill_chat.values(), default=0),
    }
    unseen = [m.token for m in load.messages if m.kind == "approve" and m.token not in load.presses]
    if unseen:
        notes.append(f"approval prompts never seen: {', '.join(unseen[:10])}")
    return SoakResult(counts=counts, violations=violations, notes=notes)


# ---------------------------------------------------------------------------------------
# Waiting for the drain
# ---------------------------------------------------------------------------------------


def outstanding(api: FakeTelegramAPI, driver: LoadDriver, store: Store) -> list[str]:
    """What is not finished yet (empty: everything drained)."""
    load = driver.load
    waiting: list[str] = []
    if api.pending_updates:
        waiting.append(f"{len(api.pending_updates)} update(s) not acknowledged")
    answered = {
        (int(c.params["chat_id"]), _reply_id(c))
        for c in api.calls
        if c.method == "sendMessage" and c.ok
    }
    unanswered = [m for m in load.messages if (m.chat, m.message_id) not in answered]
    if unanswered:
        waiting.append(f"{len(unanswered)} message(s) unanswered")
    approvals = [m for m in load.messages if m.kind == "approve"]
    unpressed = [m for m in approvals if not (p := load.presses.get(m.token)) or not p.pushed]
    if unpressed:
        waiting.append(f"{len(unpressed)} approval(s) not pressed")
    if any(not d.accepted for d in load.deliveries):
        waiting.append("webhook deliveries not accepted")
    unfinished = [r for r in store.inbox if r["status"] not in TERMINAL]
    if unfinished:
        waiting.append(f"{len(unfinished)} inbound(s) unfinished")
    queued = [r for r in store.outbox if r.status == "queued"]
    if queued:
        waiting.append(f"{len(queued)} outbound(s) queued")
    active = [r for r in store.reminders if r["status"] == "active"]
    if active:
        waiting.append(f"{len(active)} reminder(s) not yet due")
    return waiting


def _has_reminder(db_path: Path, text: str) -> bool:
    conn = sqlite3.connect(db_path, timeout=10)
    try:
        return conn.execute("SELECT 1 FROM reminders WHERE text = ?", [text]).fetchone() is not None
    finally:
        conn.close()


def _reply_id(call: Call) -> int | None:
    reply = call.params.get("reply_parameters")
    if isinstance(reply, str):
        reply = json.loads(reply)
    if isinstance(reply, dict) and reply.get("message_id") is not None:
        return int(reply["message_id"])
    return None


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


async def chaos(
    cfg: SoakConfig,
    daemon: DaemonProcess,
    rng: random.Random,
    startup: float,
    deadline: float,
    before_long_outage: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """SIGKILL the daemon ``cfg.kills`` times at random moments, restarting it each time."""
    long_at = cfg.kills // 2 if cfg.late_outage > 0 else -1
    for k in range(cfg.kills):
        if time.monotonic() > deadline:
            raise TimeoutError("the run took too long (chaos phase)")
        if k != long_at and rng.random() < cfg.startup_kill_chance:
            # During start-up: store opening, recovery, channels connecting…
            await asyncio.sleep(rng.uniform(0.05, max(0.1, startup)))
        else:
            if daemon.current.ready_mono is None:
                await daemon.wait_ready(cfg.start_timeout)
            await asyncio.sleep(rng.uniform(cfg.min_up, cfg.max_up))
            if k == long_at and before_long_outage is not None:
                await before_long_outage()
        await daemon.kill()
        down = cfg.late_outage if k == long_at else rng.uniform(0.0, cfg.max_down)
        await asyncio.sleep(down)
        await daemon.spawn()
    await daemon.wait_ready(cfg.start_timeout)


def prepare_workdir(workdir: Path) -> tuple[Path, Path]:
    state_dir, logs = workdir / "state", workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return state_dir, logs


async def run_soak(cfg: SoakConfig, workdir: Path, log: Any = None) -> SoakResult:
    """The whole soak in ``workdir`` (state dir, config and daemon logs end up there)."""
    say = log or (lambda _msg: None)
    started = time.monotonic()
    deadline = started + cfg.max_seconds
    state_dir, logs = prepare_workdir(workdir)
    rng = random.Random(cfg.seed)
    stop = asyncio.Event()
    daemon: DaemonProcess | None = None
    from aiohttp import ClientSession, ClientTimeout

    async with (
        FakeTelegramAPI(token=TOKEN) as api,
        ClientSession(timeout=ClientTimeout(total=5)) as http,
    ):
        if cfg.send_latency > 0:
            sends = 20 * (cfg.messages + cfg.reminders + cfg.webhooks + cfg.approvals) + 1000
            api.delay_next("sendMessage", cfg.send_latency, count=sends)
        port = free_port()
        users = [FIRST_USER + i for i in range(cfg.users)]
        config = workdir / "config.toml"
        db_path = state_dir / DB_FILENAME
        write_config(config, api.base_url, users, port)
        daemon = DaemonProcess(config, state_dir, logs)
        driver = LoadDriver(cfg, api, f"http://127.0.0.1:{port}/hooks/{ROUTE}")
        driver.http = http
        helpers: list[asyncio.Task[None]] = []
        exit_code: int | None = None
        try:
            await daemon.spawn()
            await daemon.wait_ready(cfg.start_timeout)
            startup = daemon.current.ready_mono - daemon.current.spawn_mono  # type: ignore[operator]
            say(f"daemon ready in {startup:.1f} s; {cfg.kills} kills ahead")
            cycle = startup + (cfg.min_up + cfg.max_up) / 2 + cfg.max_down / 2
            spread = cfg.kills * cycle + cfg.late_outage
            helpers = [
                asyncio.create_task(driver.retry_deliveries(stop, deadline)),
                asyncio.create_task(driver.press_approvals(stop, deadline)),
            ]
            generator = asyncio.create_task(driver.generate(spread, deadline))
            await chaos(
                cfg,
                daemon,
                rng,
                startup,
                deadline,
                before_long_outage=lambda: driver.plant_late_reminder(db_path, 15.0),
            )
            say(f"{cfg.kills} kills done; waiting for the load to finish")
            await asyncio.wait_for(generator, max(1.0, deadline - time.monotonic()))
            say("draining")
            drain_end = min(deadline, time.monotonic() + cfg.drain_timeout)
            waiting: list[str] = ["not looked yet"]
            while time.monotonic() < drain_end:
                store = await asyncio.to_thread(read_store, db_path)
                waiting = outstanding(api, driver, store)
                if not waiting:
                    break
                await asyncio.sleep(0.5)
            if waiting:
                say(f"drain timed out: {'; '.join(waiting)}")
            await asyncio.sleep(cfg.quiet)  # room for a late duplicate to show up
            stop.set()
            await asyncio.gather(*helpers, return_exceptions=True)
            exit_code = await daemon.terminate()
        finally:
            stop.set()
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            await driver.close()
            if daemon is not None and daemon.running:
                await daemon.terminate(timeout=10)
            if daemon is not None:
                daemon.ensure_dead()
        store = await asyncio.to_thread(read_store, db_path, True)
        result = analyse(
            api=api,
            load=driver.load,
            store=store,
            incarnations=daemon.incarnations,
            workspace=state_dir / "workspace",
            exit_code=exit_code,
            expect_late=cfg.late_outage > LATE_NOTE_AFTER,
        )
    result.seconds = time.monotonic() - started
    result.seed = cfg.seed
    return result


def main(argv: list[str] | None = None) -> int:
    defaults = SoakConfig()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in fields(SoakConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = type(getattr(defaults, f.name))
        parser.add_argument(flag, type=kind, default=getattr(defaults, f.name), metavar=f.name)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep state and logs here (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    cfg = SoakConfig(**{f.name: getattr(args, f.name) for f in fields(SoakConfig)})
    if args.workdir is not None:
        workdir = args.workdir.resolve()
    else:
        import tempfile

        workdir = Path(tempfile.mkdtemp(prefix="echo-bot-soak-"))

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    say(f"soak in {workdir}")
    result = asyncio.run(run_soak(cfg, workdir, say))
    print(result.table())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
