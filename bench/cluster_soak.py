"""Cluster soak: N `echo-bot run` processes on one PostgreSQL database, SIGKILLed and
restarted at random while work goes in.

Like ``bench/soak.py``, with several daemons instead of one: the fake Bot API server
(Telegram) and a fresh database are made here; every daemon runs the same config (its
own port and state dir, one shared workspace). The seeded load:

* signed webhook deliveries (Standard Webhooks), spread over all daemons and retried on
  another while one is down (as a sender behind a load balancer would), each calling
  ``shell_exec`` to append the delivery's token to ``effects.txt`` — a dangerous call,
  so each asks for approval in the owner's chat, and the owner taps Approve;
* chat messages ``what time is it? [token]`` from the owner (a reply each);
* reminders ``/tool reminder_create`` due a few seconds later (each must fire once).

Meanwhile a random live daemon is SIGKILLed at random moments and started again (same
name, same state dir). After the last restart and a drain, the checks read the fake Bot
API's log, ``effects.txt`` and the database:

* lost: every delivery accepted and finished, every message answered, every reminder
  fired, nothing left queued or unfinished in the database;
* twice: no token in ``effects.txt`` more than once; a delivery whose token is missing
  must have been reported OUTCOME_UNKNOWN (its call was running at a kill);
* duplicates: a chat message answered twice, a reminder notice or a result sent twice —
  allowed only as a send in flight at a kill (at most one per kill per chat);
* the Telegram poller was taken over after each kill of the daemon that polled.

    python bench/cluster_soak.py --instances 3 --kills 20 --seed 1
    python bench/cluster_soak.py --quick          # 2 daemons, 3 kills, small load
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from tempfile import mkdtemp
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import free_port  # noqa: E402
from tests.fakes.telegram_api import FakeTelegramAPI  # noqa: E402
from tests.postgres import drop_database  # noqa: E402

TOKEN = "123456:CLUSTER-soak-token"
OWNER = 42
SECRET = "whsec_" + base64.b64encode(b"cluster-soak-standard-webhooks!!").decode()
SECRET_ENV = "CLUSTER_SOAK_SECRET"
DEFAULT_POSTGRES = "postgresql://echo_bot_test:echo_bot_test@127.0.0.1:5432/postgres"


@dataclass
class Knobs:
    instances: int = 3
    kills: int = 20
    seed: int = 1
    deliveries: int = 40
    messages: int = 30
    reminders: int = 12
    min_up: float = 1.0  # seconds between kills, at least
    max_up: float = 4.0
    max_down: float = 2.0  # a killed daemon is started again within this
    drain_timeout: float = 180.0
    quiet: float = 3.0  # after the drain: room for a late duplicate


def config(api: FakeTelegramAPI, port: int, workspace: Path) -> str:
    argv = ["sh", "-c", 'echo "$0" >> effects.txt', "{payload[token]}"]
    return f"""
[bot]
shutdown_timeout = "5s"
[storage]
engine = "postgres"
[telegram]
enabled = true
api_base = "{api.base_url}"
allowed_users = [{OWNER}]
[http]
port = {port}
[tools]
profile = "coding"
workspace = "{workspace}"
[tools.shell]
enabled = true
[webhook]
enabled = true

[[webhook.routes]]
name = "effect"
auth = "standard"
secret_env = "{SECRET_ENV}"
rate_limit = 100000
tool = "shell_exec"
args = {{ argv = {json.dumps(argv)} }}
deliver_to = "telegram:{OWNER}"
"""


@dataclass
class Incarnation:
    daemon: int
    pid: int
    spawned: float
    killed: float | None = None


class Daemon:
    """One `echo-bot run`: started, killed and started again; stderr to a file each time."""

    def __init__(self, index: int, config: Path, state: Path, logs: Path, env: dict[str, str]):
        self.index, self.config, self.state, self.logs, self.env = index, config, state, logs, env
        self.proc: asyncio.subprocess.Process | None = None
        self.log: TextIO | None = None
        self.log_path: Path | None = None
        self.incarnations: list[Incarnation] = []

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, ready_within: float = 60.0) -> None:
        self.log_path = self.logs / f"daemon-{self.index}-{len(self.incarnations):02d}.log"
        self.log = self.log_path.open("w")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "echo_bot", "run",
            "--config", str(self.config), "--state-dir", str(self.state),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=self.log, env=self.env, cwd=ROOT,
        )  # fmt: skip
        self.incarnations.append(Incarnation(self.index, self.proc.pid, time.monotonic()))
        deadline = time.monotonic() + ready_within
        while time.monotonic() < deadline:
            if "stop with" in self.log_path.read_text(errors="replace"):
                return
            if self.proc.returncode is not None:
                raise RuntimeError(f"daemon {self.index} exited: {self.tail()}")
            await asyncio.sleep(0.05)
        raise RuntimeError(f"daemon {self.index} not ready: {self.tail()}")

    def tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def said(self, text: str) -> bool:
        return self.log_path is not None and text in self.log_path.read_text(errors="replace")

    async def kill(self) -> None:
        assert self.proc is not None
        self.incarnations[-1].killed = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()
        self._close()

    async def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                await self.kill()
                return None
        self._close()
        return self.proc.returncode

    def _close(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None


def signed(body: bytes, msg_id: str) -> dict[str, str]:
    from standardwebhooks.webhooks import Webhook

    now = datetime.now(UTC)
    return {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(SECRET).sign(msg_id, now, body.decode()),
    }


@dataclass
class Load:
    deliveries: dict[str, bool] = field(default_factory=dict)  # token → accepted
    messages: dict[int, str] = field(default_factory=dict)  # message id → token
    reminders: list[str] = field(default_factory=list)  # tokens


class Driver:
    def __init__(self, knobs: Knobs, api: FakeTelegramAPI, daemons: list[Daemon]) -> None:
        self.knobs, self.api, self.daemons = knobs, api, daemons
        self.rng = random.Random(knobs.seed)
        self.load = Load()
        self.pressed: set[int] = set()

    async def deliver(self, session: Any, token: str) -> None:
        import aiohttp

        body = json.dumps({"token": token}).encode()
        self.load.deliveries[token] = False
        for attempt in range(2000):
            daemon = self.daemons[(hash(token) + attempt) % len(self.daemons)]
            port = int(daemon.config.read_text().split("port = ")[1].split()[0])
            url = f"http://127.0.0.1:{port}/hooks/effect"
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with session.post(url, data=body, headers=signed(body, token)) as r:
                    if r.status in (200, 202):
                        self.load.deliveries[token] = True
                        return
            await asyncio.sleep(0.2)

    async def generate(self, spread: float) -> None:
        import aiohttp

        k = self.knobs
        plan = ["hook"] * k.deliveries + ["ask"] * k.messages + ["remind"] * k.reminders
        self.rng.shuffle(plan)
        counts: collections.Counter[str] = collections.Counter()
        tasks = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for kind in plan:
                counts[kind] += 1
                token = f"{kind}-{k.seed}-{counts[kind]:03d}"
                if kind == "hook":
                    tasks.append(asyncio.create_task(self.deliver(session, token)))
                elif kind == "ask":
                    mid = self._push(f"what time is it? [{token}]")
                    self.load.messages[mid] = token
                else:
                    args = {"text": token, "when": f"in {self.rng.randint(3, 12)} seconds"}
                    self._push(f"/tool reminder_create {json.dumps(args)}")
                    self.load.reminders.append(token)
                await asyncio.sleep(self.rng.uniform(0, 2 * spread / len(plan)))
            await asyncio.gather(*tasks)

    def _push(self, text: str) -> int:
        self.api.push_message(text, user_id=OWNER)
        return int(self.api.pushed_updates[-1]["message"]["message_id"])

    async def press(self, stop: asyncio.Event) -> None:
        """Tap Approve on every prompt, once each (a repeated prompt too: harmless)."""
        while not stop.is_set():
            for call in self.api.calls_of("sendMessage"):
                markup = call.params.get("reply_markup")
                if not markup or call.response is None or not call.response.get("ok"):
                    continue
                message_id = call.response["result"]["message_id"]
                if message_id in self.pressed:
                    continue
                self.pressed.add(message_id)
                markup = json.loads(markup) if isinstance(markup, str) else markup
                data = markup["inline_keyboard"][0][0]["callback_data"]
                if data.startswith("approve"):
                    self.api.push_callback(
                        data, user_id=OWNER, message_id=message_id, chat_id=OWNER
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.3)


def poller_pid(url: str) -> int | None:
    """The pid of the daemon holding the Telegram poller lease, if it is alive."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT i.pid FROM leases l JOIN instances i ON i.name = l.instance"
            " WHERE l.name LIKE 'telegram-poller:%'"
            " AND i.seen_at >= extract(epoch from clock_timestamp()) - 15"
        ).fetchone()
    return int(row[0]) if row else None


async def chaos(
    knobs: Knobs, daemons: list[Daemon], rng: random.Random, url: str
) -> tuple[int, list[float]]:
    """SIGKILL a live daemon ``kills`` times — every third kill the one polling Telegram,
    the others at random — each started again soon after. Returns the poller kills and,
    for each, how long until another daemon polled."""
    takeovers: list[float] = []
    for k in range(knobs.kills):
        await asyncio.sleep(rng.uniform(knobs.min_up, knobs.max_up))
        live = [d for d in daemons if d.running]
        polling = await asyncio.to_thread(poller_pid, url)
        poller = next((d for d in live if d.proc is not None and d.proc.pid == polling), None)
        victim = poller if k % 3 == 0 and poller is not None else rng.choice(live)
        await victim.kill()
        if victim is poller:
            killed = time.monotonic()
            while (now := await asyncio.to_thread(poller_pid, url)) in (None, polling):
                await asyncio.sleep(0.2)
                if time.monotonic() - killed > 60:
                    break
            if now not in (None, polling):
                takeovers.append(time.monotonic() - killed)
        await asyncio.sleep(rng.uniform(0, knobs.max_down))
        await victim.start()
    return len(takeovers), takeovers


def stored(url: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(url) as conn:
        one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
        return {
            "unfinished": one(
                "SELECT COUNT(*) FROM inbox WHERE status NOT IN"
                " ('done', 'failed', 'denied', 'expired')"
            ),
            "queued": one("SELECT COUNT(*) FROM outbox WHERE status = 'queued'"),
            "failed_out": one("SELECT COUNT(*) FROM outbox WHERE status = 'failed'"),
            "active_reminders": one("SELECT COUNT(*) FROM reminders WHERE status = 'active'"),
            "fires": dict(
                conn.execute(
                    "SELECT r.text, COUNT(f.reminder_id) FROM reminders r LEFT JOIN"
                    " reminder_fires f ON f.reminder_id = r.id GROUP BY r.text"
                ).fetchall()
            ),
            # Reminders whose reminder_create call was running at a kill: at most once,
            # so never made (OUTCOME_UNKNOWN), as a delivery's command is never run twice.
            "reminder_calls": {
                str(json.loads(args).get("text")): f"call {status}: {str(result)[:80]}"
                for args, status, result in conn.execute(
                    "SELECT args, status, result FROM tool_calls WHERE name = 'reminder_create'"
                ).fetchall()
            },
            "reminder_rows": dict(conn.execute("SELECT text, status FROM reminders").fetchall()),
            "unknown_reminders": {
                str(json.loads(row[0]).get("text"))
                for row in conn.execute(
                    "SELECT args FROM tool_calls WHERE name = 'reminder_create'"
                    " AND result LIKE '%OUTCOME_UNKNOWN%'"
                ).fetchall()
            },
            "unknown": {
                row[0]
                for row in conn.execute(
                    "SELECT i.external_id FROM inbox i JOIN tool_calls c ON c.turn_id = i.id"
                    " WHERE i.channel = 'webhook' AND c.result LIKE '%OUTCOME_UNKNOWN%'"
                ).fetchall()
            },
        }


def effects(workspace: Path) -> collections.Counter[str]:
    path = workspace / "effects.txt"
    lines = path.read_text().split() if path.exists() else []
    return collections.Counter(lines)


def answers(api: FakeTelegramAPI) -> collections.Counter[int]:
    """How many "It is …" replies each chat message got."""
    got: collections.Counter[int] = collections.Counter()
    for call in api.calls_of("sendMessage"):
        if not call.params.get("text", "").startswith("It is") or not call.ok:
            continue
        reply = call.params.get("reply_parameters")
        reply = json.loads(reply) if isinstance(reply, str) else reply
        if isinstance(reply, dict) and reply.get("message_id") is not None:
            got[int(reply["message_id"])] += 1
    return got


def notices(api: FakeTelegramAPI, token: str) -> int:
    return sum(
        1
        for c in api.calls_of("sendMessage")
        if c.ok and c.params.get("text", "").startswith("⏰") and token in c.params.get("text", "")
    )


async def run(knobs: Knobs, admin: str, work: Path, say: Any) -> tuple[bool, str]:
    import psycopg

    name = f"echo_bot_cluster_soak_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))
    workspace, logs = work / "workspace", work / "logs"
    workspace.mkdir(parents=True)
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if k in {"PATH", "HOME", "LANG", "TMPDIR"}}
    env.update({"TELEGRAM_BOT_TOKEN": TOKEN, SECRET_ENV: SECRET, "ECHO_BOT_DATABASE_URL": url})
    rng = random.Random(knobs.seed * 31 + 7)
    started = time.monotonic()
    daemons: list[Daemon] = []
    stop = asyncio.Event()
    try:
        async with FakeTelegramAPI(token=TOKEN) as api:
            for i in range(knobs.instances):
                path = work / f"daemon-{i}.toml"
                path.write_text(config(api, free_port(), workspace))
                daemons.append(Daemon(i, path, work / f"state-{i}", logs, env))
            for daemon in daemons:
                await daemon.start()
            say(f"{knobs.instances} daemons ready; {knobs.kills} kills ahead")
            driver = Driver(knobs, api, daemons)
            presser = asyncio.create_task(driver.press(stop))
            spread = knobs.kills * (knobs.min_up + knobs.max_up) / 2
            load = asyncio.create_task(driver.generate(spread))
            poller_kills, takeovers = await chaos(knobs, daemons, rng, url)
            say("kills done; waiting for the load and the drain")
            await asyncio.wait_for(load, knobs.drain_timeout)
            deadline = time.monotonic() + knobs.drain_timeout
            waiting = ["not looked yet"]
            while time.monotonic() < deadline:
                db = await asyncio.to_thread(stored, url)
                done = effects(workspace)
                got = answers(api)
                waiting = []
                missing = [
                    t for t in driver.load.deliveries if t not in done and t not in db["unknown"]
                ]
                if missing:
                    waiting.append(f"{len(missing)} deliveries without their effect")
                unanswered = [m for m in driver.load.messages if not got[m]]
                if unanswered:
                    waiting.append(f"{len(unanswered)} messages unanswered")
                unfired = [
                    t
                    for t in driver.load.reminders
                    if not notices(api, t) and t not in db["unknown_reminders"]
                ]
                if unfired:
                    why = "; ".join(
                        f"{t}: row {db['reminder_rows'].get(t, 'none')},"
                        f" {db['reminder_calls'].get(t, 'no call')}"
                        for t in unfired
                    )
                    waiting.append(f"{len(unfired)} reminders not delivered ({why})")
                for key in ("unfinished", "queued", "active_reminders"):
                    if db[key]:
                        waiting.append(f"{db[key]} {key}")
                if not waiting:
                    break
                await asyncio.sleep(0.5)
            await asyncio.sleep(knobs.quiet)
            stop.set()
            await presser
            db = await asyncio.to_thread(stored, url)
            done, got = effects(workspace), answers(api)
            exits = [await d.stop() for d in daemons]
            kills = [i for d in daemons for i in d.incarnations if i.killed is not None]
            twice = {t: n for t, n in done.items() if n > 1}
            unknown_missing = [
                t for t in driver.load.deliveries if t not in done and t not in db["unknown"]
            ]
            answered_twice = sum(n - 1 for n in got.values() if n > 1)
            notices_twice = sum(max(0, notices(api, t) - 1) for t in driver.load.reminders)
            fired_twice = sum(1 for t in driver.load.reminders if db["fires"].get(t, 0) > 1)
            lost = len(waiting) if waiting else 0
            rows = [
                ("daemons, kills (of the poller)", f"{knobs.instances}, {len(kills)}"
                 f" ({poller_kills})", ""),
                ("  polling taken over after a poller kill, within", f"{max(takeovers):.1f} s"
                 if takeovers else "-", "≤ the lease (15 s)"),
                ("webhook deliveries accepted", sum(driver.load.deliveries.values()),
                 f"= {knobs.deliveries}"),
                ("  effect once", sum(1 for t in driver.load.deliveries if done[t] == 1), ""),
                ("  OUTCOME_UNKNOWN (running at a kill), no effect", len(
                    [t for t in driver.load.deliveries if t in db["unknown"] and not done[t]]),
                 ""),
                ("  effect twice", len(twice), "must be 0"),
                ("  neither effect nor OUTCOME_UNKNOWN", len(unknown_missing), "must be 0"),
                ("chat messages answered", sum(1 for m in driver.load.messages if got[m]),
                 f"= {knobs.messages}"),
                ("  answered twice (a send in flight at a kill)", answered_twice,
                 f"≤ {len(kills)}"),
                ("reminders fired once", sum(
                    1 for t in driver.load.reminders if db["fires"].get(t, 0) == 1),
                 f"= {knobs.reminders} - OUTCOME_UNKNOWN"),
                ("  reminder_create OUTCOME_UNKNOWN (running at a kill), none made", len(
                    [t for t in driver.load.reminders if t in db["unknown_reminders"]
                     and t not in db["fires"]]), ""),
                ("  fired twice", fired_twice, "must be 0"),
                ("  notice sent twice (in flight at a kill)", notices_twice, f"≤ {len(kills)}"),
                ("unfinished / queued / failed outbound at the end",
                 f"{db['unfinished']} / {db['queued']} / {db['failed_out']}", "must be 0"),
                ("final SIGTERM exit codes", ", ".join(str(e) for e in exits), "all 0"),
                ("not drained", "; ".join(waiting) or "-", "must be -"),
            ]  # fmt: skip
            ok = (
                not twice
                and not unknown_missing
                and fired_twice == 0
                and answered_twice <= len(kills)
                and notices_twice <= len(kills)
                and not lost
                and db["failed_out"] == 0
                and all(e == 0 for e in exits)
                and all(driver.load.deliveries.values())
            )
            lines = ["| check | count | expected |", "| --- | --- | --- |"]
            lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
            lines.append(
                f"\n{'OK' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s"
                f" (seed {knobs.seed}; logs in {logs})"
            )
            return ok, "\n".join(lines)
    finally:
        stop.set()
        for daemon in daemons:
            if daemon.running:
                with contextlib.suppress(Exception):
                    await daemon.kill()
        drop_database(admin, name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Knobs()
    for key, value in vars(defaults).items():
        parser.add_argument("--" + key.replace("_", "-"), type=type(value), default=value)
    parser.add_argument("--quick", action="store_true", help="2 daemons, 3 kills, small load")
    parser.add_argument(
        "--database-url", default=os.environ.get("ECHO_BOT_TEST_POSTGRES", DEFAULT_POSTGRES)
    )
    args = parser.parse_args(argv)
    knobs = Knobs(**{k: getattr(args, k) for k in vars(defaults)})
    if args.quick:
        knobs.instances, knobs.kills = 2, 3
        knobs.deliveries, knobs.messages, knobs.reminders = 8, 6, 3
    knobs.instances = max(2, min(knobs.instances, 8))
    work = Path(mkdtemp(prefix="echo-bot-cluster-soak-"))

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    ok, table = asyncio.run(run(knobs, args.database_url, work, say))
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
