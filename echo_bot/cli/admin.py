"""Management commands that work beside a running daemon: they read the store, and
submit decisions as inbox events that the daemon picks up (within a second or two)."""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .. import overview
from ..approvals.display import decider, escape_text, render_call, show_json
from ..approvals.routing import OWNER_QUEUE, OWNER_QUEUE_TEXT, ApproverDirectory
from ..config import (
    Config,
    LoadedConfig,
    channel_enabled,
    channel_section,
    console_base,
    console_exposure,
    llm_enabled,
    secrets_in_use,
    triggers,
)
from ..durations import format_duration
from ..errors import ConfigError, EchoBotError, NoSchema
from ..events import (
    Address,
    ApprovalDecision,
    DecisionInbound,
    DecisionVerb,
    InboundStatus,
    Sender,
)
from ..overview import Overview, cancel_reminder, holding, mcp_state
from ..plugins import local_channel, registry
from ..secrets import Masker
from ..statedir import daemon_pid
from ..statuses import ApprovalStatus
from ..store import (
    DB_FILENAME,
    Database,
    Store,
    Tx,
    backup_to,
    copy_sqlite_to_postgres,
    describe_url,
    is_empty_file,
    make_database,
)
from ..store.approvals import ApprovalRow

if TYPE_CHECKING:
    from ..runtime import Runtime

T = TypeVar("T")

# A request id may be shortened to a unique prefix of at least this many characters.
MIN_ID_PREFIX = 6
_AMBIGUOUS_SHOWN = 10


def _admin_address() -> Address:
    """Where a decision taken with ``echo-bot approvals`` is recorded: the owner at the
    machine, as the terminal's chat ``admin``."""
    return Address(channel=local_channel(), chat_id="admin")


@dataclass(frozen=True)
class CommandContext:
    """What a command that says its own handler (``webhook``) is run with: the config
    read, the state dir, the environment with credentials; the store on demand."""

    loaded: LoadedConfig
    state_dir: Path
    environ: Mapping[str, str]

    def store(self) -> StoreAt:
        return StoreAt.of(self.loaded, self.state_dir, self.environ)


def _clock(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True, slots=True)
class StoreAt:
    """Where the management commands find the store: the state directory's SQLite file,
    or the PostgreSQL database of ``[storage] engine = "postgres"`` (``url``)."""

    state_dir: Path
    url: str | None = None

    @classmethod
    def of(cls, loaded: LoadedConfig, state_dir: Path, environ: Mapping[str, str]) -> StoreAt:
        storage = loaded.config.storage
        if storage.engine != "postgres":
            return cls(state_dir)
        url = environ.get(storage.url_env)
        if not url:
            raise ConfigError(
                f"storage.url_env: environment variable {storage.url_env} is not set (the"
                " PostgreSQL URL, postgresql://user:password@host:5432/database)"
            )
        return cls(state_dir, url)

    @property
    def path(self) -> Path:
        return self.state_dir / DB_FILENAME

    def describe(self) -> str:
        if self.url is None:
            return str(self.path)
        return f"PostgreSQL {describe_url(self.url)}"


class NoStoreYet(EchoBotError):
    """No store at ``at`` yet (the daemon never ran there): a command that asked for
    something in it exits 1 with the reason; one that lists says "nothing yet"."""


def _with_store(
    at: StoreAt, fn: Callable[[Tx], T], *, create: bool = False, reads_only: bool = False
) -> T:
    """``fn(tx)`` in one transaction on the store ``at``; ``create``: make the store
    if there is none yet, else there is nothing to read (``NoStoreYet``)."""
    if at.url is not None:
        database = make_database("postgres", state_dir=at.state_dir, url=at.url)
    else:
        if not create and not at.path.exists():
            raise NoStoreYet(f"no store at {at.path} yet; `echo-bot run` creates it")
        database = Database(at.path, reads_only=reads_only)
    # The audit rows these commands write (a console session revoked) hold no secret,
    # so the store has nothing to mask; what they print is masked on the way out
    # (secrets.masked_output).
    store = Store(database, Masker())
    try:
        # Never a migration (a store behind this version is refused: the daemon still
        # running the old one would find it changed under it), only a store made new.
        store.open_sync(create=False)
    except NoSchema as exc:  # nothing to read, and reading it changes nothing
        if not create:
            raise NoStoreYet(str(exc)) from None
        store.open_sync(create=True)
    try:
        return store.run_sync(fn)
    finally:
        store.close_sync()


def _listed(at: StoreAt, fn: Callable[[Tx], list[T]]) -> list[T]:
    """What a listing reads: nothing yet where no store is (said on stderr, exit 0
    follows: nothing is wrong with a state dir the daemon has not used yet)."""
    try:
        return _with_store(at, fn, reads_only=True)
    except NoStoreYet as exc:
        print(f"echo-bot: {exc}", file=sys.stderr)
        return []


# -- check-config -------------------------------------------------------------------------
def check_config(loaded: LoadedConfig, state_dir: Path, env: Mapping[str, str]) -> int:
    """``env``: the environment with the systemd credentials filled in."""
    from ..app import http_reasons, load_channel_class
    from ..config import channel_names
    from ..runtime import build

    runtime = build(loaded, state_dir, env)  # made as `run` makes it, and not started
    at = StoreAt.of(loaded, state_dir, env)
    config = loaded.config
    if config.mcp.servers:
        from ..mcp.hub import sdk_missing

        missing = sdk_missing()
        if missing is not None:
            raise ConfigError(missing)
    # The channels `run` starts (but the terminal), each loaded as `run` loads it: a
    # library not installed fails here as it would there.
    running = [
        name
        for name in channel_names()
        if not registry()[name].local and channel_enabled(loaded, env, name)
    ]
    for name in running:
        load_channel_class(name)
    reasons = http_reasons(config, running)
    http = (
        f"{config.http.host}:{config.http.port} ({', '.join(reasons)})"
        if reasons
        else "off, no port opened ([http] enabled = true serves /healthz and /metrics)"
    )
    lines = [
        f"config: {loaded.path or 'embedded defaults'} — valid",
        f"state dir: {state_dir}",
        f"storage: {'SQLite ' if at.url is None else ''}{at.describe()}"
        f" (retention {format_duration(config.storage.retention)})",
        f"brain: {'llm (' + config.openai.model + ')' if llm_enabled(loaded, env) else 'rules'}",
        *_channel_lines(loaded, running),
        f"http server: {http}",
        _console_line(config),
        f"cron jobs: {len(config.cron)}",
        f"tools (profile {config.tools.profile}): "
        + (", ".join(t.name for t in runtime.exposed()) or "none"),
        _tool_line("shell_exec", runtime, "[tools.shell] enabled = true switches it on"),
        _tool_line("http_request", runtime, "[tools.http] allow_domains switches it on"),
        f"approvals: timeout {format_duration(config.approvals.timeout)}, "
        f"default chat {config.approvals.default_chat or 'none'}",
        *_prompt_lines(loaded, env, runtime.live.current.directory),
    ]
    secrets = [
        f"{name} {'set' if env.get(name) else 'not set' if needed else 'not set (optional)'}"
        for name, needed in secrets_in_use(loaded, env)
    ]
    lines.append("secrets (environment or credentials): " + (", ".join(secrets) or "none needed"))
    lines += [f"warning: {text}" for text in _warnings(config)]
    print("\n".join(lines))
    return 0


def _warnings(config: Config) -> list[str]:
    """What is valid but will not work as people expect, or is dangerous."""
    found = []
    exposure = console_exposure(config)
    if exposure is not None:
        found.append(exposure)
    for spec in registry().specs.values():
        section = channel_section(config, spec.name)
        if not spec.chats or section is None:
            continue
        if getattr(section, "enabled", False) and not spec.allowed_users(section):
            name = spec.name
            found.append(
                f"[{name}] allowed_users is empty: nobody can chat with the bot there (nor"
                " invite it anywhere); list the people it serves by their IDs"
            )
    return found


def _channel_lines(loaded: LoadedConfig, running: list[str]) -> list[str]:
    """One line per installed channel (but the terminal's, which runs when asked): what
    its spec says of it when it runs, else off."""
    lines = []
    for spec in registry().specs.values():
        if spec.local:
            continue
        section = channel_section(loaded.config, spec.name)
        on = spec.name in running and section is not None
        lines.append(f"{spec.name}: {spec.summary(section) if on else 'off'}")
    return lines


def _console_line(config: Config) -> str:
    console = config.console
    if not console.enabled:
        return "console: off ([console] enabled = true serves it under /console/)"
    where = f"{console_base(config)}/console/"
    note = "" if console.public_url else " — set [console] public_url to your proxy's address"
    return (
        f"console: on at {where} (links work once, for {format_duration(console.link_ttl)}; "
        f"sessions last {format_duration(console.session_ttl)}){note}"
    )


def _tool_line(name: str, runtime: Runtime, how: str) -> str:
    """Whether a tool that is off by default is on, and if not, how it is switched on;
    on but left out by the tools profile, how it is let in."""
    tool = runtime.registry.get(name)
    if tool is None or not tool.available():
        return f"{name}: off ({how})"
    if tool not in runtime.exposed():
        return f"{name}: on, but not offered: the tools profile leaves it out ([tools] allow)"
    return f"{name}: on"


def _prompt_lines(
    loaded: LoadedConfig, environ: Mapping[str, str], directory: ApproverDirectory
) -> list[str]:
    """Where approval prompts go (docs/SECURITY.md "Where the prompt goes"): a requester who
    approves in their own chat is asked there; everyone else's prompts, and those of
    each cron job and channel's trigger (a webhook's route), go where
    ``ApproverDirectory.routed`` says."""

    def where(deliver_to: str | None) -> str:
        address, why = directory.routed(Address.parse(deliver_to) if deliver_to else None)
        if address == OWNER_QUEUE:
            return f"{OWNER_QUEUE_TEXT} ({why})"
        return f"{address} ({why})"

    config = loaded.config
    lines = [
        "approval prompts: in the requester's own chat when they approve there; "
        f"others' go to {where(None)}"
    ]
    for name, trigger in triggers(config):
        if channel_enabled(loaded, environ, name):
            lines.append(f"  {name} {trigger.who}: {where(trigger.deliver_to)}")
    for job in config.cron:
        lines.append(f"  cron job {job.name}: {where(job.deliver_to)}")
    return lines


# -- approvals ----------------------------------------------------------------------------
def approvals_command(at: StoreAt, action: str, approval_id: str | None, wait: float) -> int:
    if action == "list":
        rows = _listed(at, lambda tx: tx.approvals.list())
        if not rows:
            print("No approvals are pending.")
            return 0
        for row in rows:
            who = escape_text(str(row.requested_by.get("name") or row.requested_by.get("id")))
            print(
                f"{row.id}  {escape_text(row.tool)} ({row.risk})  asked by {who} "
                f"in {escape_text(row.origin)}  prompt in {_prompt_in(row)}  "
                f"expires {_clock(row.expires_at)}"
            )
        return 0
    if not approval_id:
        print(f"echo-bot: approvals {action} needs a request id")
        return 2
    wanted = _id_prefix(approval_id, "request", "echo-bot approvals list")
    if wanted is None:
        return 2
    matches = _with_store(at, lambda tx: _approvals_by_prefix(tx, wanted), reads_only=True)
    if len(matches) > 1:
        _ambiguous(approval_id, matches, "request")
        return 2
    found = _with_store(at, lambda tx: tx.approvals.get(matches[0]) if matches else None)
    if found is None:
        print(f"echo-bot: unknown approval request {approval_id}")
        return 1
    row = found
    if action == "show":
        _show(row)
        return 0
    if row.status != ApprovalStatus.PENDING:
        who = decider(row.decided_by)
        print(
            f"echo-bot: request {row.id} is already {row.status}"
            + (f" by {who} at {_clock(row.decided_at)}" if who else "")
            + "; nothing changed"
        )
        return 1
    if time.time() >= row.expires_at:
        print(f"echo-bot: request {row.id} has expired; nothing changed")
        return 1
    return _submit_decision(at, row.id, action, wait)


def _ambiguous(given: str, matches: list[str], noun: str) -> None:
    """Say which ids ``given`` begins (at most ``_AMBIGUOUS_SHOWN`` of them), in one line."""
    shown = ", ".join(matches[:_AMBIGUOUS_SHOWN])
    more = f" and {len(matches) - _AMBIGUOUS_SHOWN} more" if len(matches) > _AMBIGUOUS_SHOWN else ""
    print(
        f"echo-bot: {given} is ambiguous: it begins {len(matches)} {noun} ids: "
        f"{shown}{more}; give more characters",
        file=sys.stderr,
    )


def _approvals_by_prefix(tx: Tx, prefix: str) -> list[str]:
    """The ids that begin with ``prefix`` (as git takes a unique prefix of a hash); an
    exact id is itself, even if a longer one began with it."""
    if tx.approvals.get(prefix) is not None:
        return [prefix]
    return tx.approvals.ids_beginning(prefix)


def _prompt_in(row: ApprovalRow) -> str:
    """Where the request was asked: a chat, or nowhere but here (no chat could ask an
    approver: it waits for `echo-bot approvals approve|deny`)."""
    if row.prompt_to == str(OWNER_QUEUE):
        return "no chat (it waits for echo-bot approvals approve|deny)"
    return escape_text(row.prompt_to)


def _show(row: ApprovalRow) -> None:
    """Every argument complete, the deciding ones first (the order the request was
    stored in), hidden characters escaped as in the chat prompt."""
    who = escape_text(str(row.requested_by.get("name") or row.requested_by.get("id")))
    print(f"request:   {row.id}")
    print(f"status:    {row.status}")
    print(f"tool:      {escape_text(row.tool)} ({row.risk})")
    print(f"call:      {render_call(row.tool, row.args)}")
    print("arguments (in full, as JSON; invisible characters shown as \\u escapes):")
    print(show_json(row.args))
    print(f"asked by:  {who} in {escape_text(row.origin)}")
    print(f"prompt in: {_prompt_in(row)}")
    print(f"created:   {_clock(row.created_at)}")
    print(f"expires:   {_clock(row.expires_at)}")
    if row.decided_at:
        by = decider(row.decided_by)
        what = f"{row.verb} by {by}" if by else row.status
        print(f"decided:   {what} at {_clock(row.decided_at)}")


def _submit_decision(at: StoreAt, approval_id: str, action: str, wait: float) -> int:
    user = getpass.getuser()
    verb = DecisionVerb.APPROVE_ONCE if action == "approve" else DecisionVerb.DENY
    message = DecisionInbound(
        address=_admin_address(),
        sender=Sender(id=user, name=user),
        decision=ApprovalDecision(
            request_id=approval_id,
            verb=verb,
            decided_by=_admin_address(),
            sender_id=user,
            via="admin",
            answered=True,  # printed by the command
        ),
        external_id=f"admin-{os.getpid()}-{time.time_ns()}",
    )
    _with_store(at, lambda tx: tx.inbox.add(message))
    pid = daemon_pid(at.state_dir)
    if pid is None and at.url is None:
        print(f"Decision recorded ({action}); no daemon is running — it applies when one starts.")
        return 0
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            row = _with_store(at, lambda tx: tx.inbox.get(message.id))
            if row is not None and row.status.terminal:
                if row.status == InboundStatus.DONE:
                    done = "Approved" if verb is DecisionVerb.APPROVE_ONCE else "Denied"
                    print(f"{done}: {approval_id}")
                    return 0
                print(f"echo-bot: refused: {row.error}")
                return 1
            time.sleep(0.2)
    except KeyboardInterrupt:  # stopping the wait takes nothing back: say so
        print(
            f"\necho-bot: stopped waiting; the decision ({action}) on {approval_id} was"
            " already submitted and the daemon applies it",
            file=sys.stderr,
        )
        return 130
    if pid is None:  # PostgreSQL: a daemon elsewhere applies it when it sees it
        print(f"Decision recorded ({action}); no daemon has applied it yet.")
        return 0
    print(f"Decision submitted; the daemon (pid {pid}) has not applied it yet.")
    return 0


# -- reminders ----------------------------------------------------------------------------
def reminders_command(at: StoreAt, action: str, reminder_id: str | None) -> int:
    from ..scheduling.reminders import render_list

    if action == "list":
        rows = _listed(at, lambda tx: tx.reminders.active())
        if not rows:
            print("No active reminders.")
            return 0
        for line, row in zip(render_list(rows).splitlines()[1:], rows, strict=True):
            print(f"{line.removeprefix('• ')}  [{row.chat}]")
        return 0
    if not reminder_id:
        print("echo-bot: reminders cancel needs a reminder id")
        return 2
    wanted = reminder_id.strip().lower()

    problem = _with_store(at, lambda tx: cancel_reminder(tx, wanted))
    if problem:
        print(f"echo-bot: {problem}")
        return 1
    print(f"Cancelled reminder {wanted}. A running daemon skips it when its time comes.")
    return 0


# -- what the model reads -----------------------------------------------------------------
def history_command(
    at: StoreAt, loaded: LoadedConfig, environ: Mapping[str, str], chat: str
) -> int:
    """``history CHAT``: what the model reads of the chat now, every line of it."""
    from ..agent.runner import HISTORY_LIMIT
    from ..brains.model_view import history_text
    from ..config import channel_names, llm_enabled

    try:
        channel = Address.parse(chat).channel
    except ValueError as exc:  # "0 message(s)" would say the chat is empty
        print(f"echo-bot: {exc}", file=sys.stderr)
        return 2
    if channel not in channel_names():
        print(f"echo-bot: {chat}: no channel {channel!r} ({', '.join(channel_names())})",
              file=sys.stderr)  # fmt: skip
        return 2

    thinks = llm_enabled(loaded, environ)
    brain = loaded.config.brain
    try:
        text = _with_store(at, lambda tx: history_text(
            tx, chat, brain, limit=HISTORY_LIMIT, llm=thinks, newest=None
        ), reads_only=True)  # fmt: skip
    except NoStoreYet as exc:
        print(f"echo-bot: {exc}", file=sys.stderr)
        return 0
    print(text)
    return 0


# -- memory notes -------------------------------------------------------------------------
def memory_command(at: StoreAt, action: str, target: str | None) -> int:
    """``memory list [CHAT]``: every chat's notes, or one chat's; ``memory forget ID``."""
    from ..memory_notes import forget_note, listing

    if action == "list":
        notes = _listed(at, lambda tx: tx.memory.of(target) if target else tx.memory.every())
        print(listing(notes, chats=not target))
        return 0
    if not target:
        print("echo-bot: memory forget needs a note id (see `echo-bot memory list`)")
        return 2
    note = _with_store(at, lambda tx: forget_note(tx, target, by="shell"))
    if note is None:
        print(f"echo-bot: no memory note {target.strip().lower()!r}", file=sys.stderr)
        return 1
    print(f"Forgotten in {note.session_key}: {note.text}")
    return 0


def _id_prefix(given: str, what: str, listing: str) -> str | None:
    """The id or prefix to look for, or None (said on stderr) when it is too short."""
    wanted = given.strip().lower()
    if len(wanted) >= MIN_ID_PREFIX:
        return wanted
    print(
        f"echo-bot: {given!r} is too short for a {what} id: give the id or at least its "
        f"first {MIN_ID_PREFIX} characters (see `{listing}`)",
        file=sys.stderr,
    )
    return None


# -- status and backup --------------------------------------------------------------------
def status_command(at: StoreAt, config: Config | None = None) -> int:
    shared = at.url is not None
    try:
        now = time.time()
        seen, sessions = _with_store(
            at, lambda tx: (overview.read(tx), len(tx.console.sessions(now))), reads_only=True
        )
    except NoStoreYet as exc:
        if not shared:
            print("daemon: not running")
        print(f"state: {at.describe()}")
        print(f"nothing yet: {exc}")
        return 0
    counts = seen.counts
    _print_daemon(at, seen.info, shared)
    print(f"state: {at.describe()}")
    for name, server in sorted(seen.mcp.items()):
        print(f"mcp {escape_text(name)}: {escape_text(mcp_state(server))}")
    _print_instances(seen, shared)
    print(
        f"inbox: {counts['inbox_pending']} pending, {counts['waiting_approval']} waiting for "
        f"approval; outbox: {counts['outbox_queued']} queued, {counts['outbox_failed']} failed"
    )
    print(f"approvals pending: {counts['approvals_pending']}; "
          f"reminders active: {counts['reminders_active']}")  # fmt: skip
    if config is not None and config.console.enabled:
        print(f"console: {console_base(config)}/console/ ({sessions} live session(s);"
              " `echo-bot console sessions` lists them)")  # fmt: skip
    for reminder in seen.reminders[:5]:
        print(f"  next: {_clock(reminder.next_at)}  {reminder.id}  {reminder.text[:60]}")
    return 0


def _print_daemon(at: StoreAt, info: dict[str, Any], shared: bool) -> None:
    """The daemon of this state dir (SQLite), and what the last one to start said."""
    # On PostgreSQL the daemons are the instances in the store (listed below, live by
    # the database's clock, as `doctor` counts them); the state dir's lock here belongs
    # to whatever uses that directory, maybe a SQLite daemon of its own: not shown.
    pid = None if shared else daemon_pid(at.state_dir)
    if pid is not None:
        uptime = int(time.time() - float(info.get("started_at", time.time())))
        print(f"daemon: running, pid {pid}, up {uptime // 3600} h {uptime % 3600 // 60} min")
    elif not shared:
        print("daemon: not running")
    if info:
        started = info.get("instance")
        last = f"last started: {escape_text(str(started))}; " if shared and started else ""
        print(f"{last}version: {info.get('version')}; brain: {info.get('brain')}; "
              f"channels: {', '.join(info.get('channels') or []) or 'none'}")  # fmt: skip


def _print_instances(seen: Overview, shared: bool) -> None:
    """The daemons that use the store: live ones (with what they hold), gone ones."""
    live, gone, now = seen.live, seen.gone, seen.now
    if live or gone or shared:
        print(f"instances: {len(live)} live" + (f", {len(gone)} gone" if gone else ""))
    for row in live:
        up = int(time.time() - row.started_at)  # both by that machine's clock, roughly
        held = holding(seen.held.get(row.name, []))
        print(
            f"  {escape_text(row.label)}: {escape_text(row.host)}, pid {row.pid},"
            f" {row.version}, up {up // 3600} h {up % 3600 // 60} min,"
            f" seen {int(now - row.seen_at)} s ago{'; ' + held if held else ''}"
        )
    for row in gone:
        print(f"  {escape_text(row.label)}: gone (last seen {_clock(row.seen_at)})")


def backup_command(at: StoreAt, target: Path, *, force: bool = False) -> int:
    """A directory ``target`` gets a new, timestamped file inside it (UTC); an existing
    file (or a link) is replaced only with ``force``."""
    if at.url is not None:
        print(
            f"echo-bot: the store is {at.describe()}: back it up with PostgreSQL's own"
            " tools (pg_dump, or the server's continuous archiving); echo-bot backup"
            " copies a SQLite store",
            file=sys.stderr,
        )
        return 2
    source = at.path
    if not source.exists():
        print(f"echo-bot: no store at {source}", file=sys.stderr)
        return 1
    if is_empty_file(source):  # a backup of it would replace a good one with nothing
        print(f"echo-bot: {source} is empty (0 bytes): nothing to back up", file=sys.stderr)
        return 1
    if target.is_dir():
        target = backup_name(target)
    if target.resolve() == source.resolve():
        print("echo-bot: the backup must not overwrite the store itself", file=sys.stderr)
        return 2
    if os.path.lexists(target) and not force:
        print(
            f"echo-bot: {target} exists; not overwritten (--force replaces it, or give a"
            " directory for a new, timestamped file)",
            file=sys.stderr,
        )
        return 2
    pages = backup_to(source, target)  # StoreError: one line, exit code 2
    print(f"Backed up {source} to {target} ({pages} pages), consistent as of now.")
    return 0


def store_copy_command(
    loaded: LoadedConfig, state_dir: Path, environ: Mapping[str, str], to: str
) -> int:
    """Copy the stopped SQLite store of ``state_dir`` into the empty PostgreSQL database
    that ``[storage] url_env`` names (whatever ``engine`` says: this is how one moves)."""
    from ..statedir import StateLock

    if to != "postgres":
        raise ConfigError(f"store copy --to {to}: only postgres is supported")
    name = loaded.config.storage.url_env
    url = environ.get(name)
    if not url or not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"storage.url_env: environment variable {name} must hold the target's URL,"
            " postgresql://user:password@host:5432/database"
        )
    source = state_dir / DB_FILENAME
    with StateLock(state_dir):  # no daemon may write the source meanwhile
        copied = copy_sqlite_to_postgres(source, url)
    print(f"Copied {source} to PostgreSQL {describe_url(url)}; rows per table, verified:")
    width = max(len(c.name) for c in copied)
    for table in copied:
        print(f"  {table.name.ljust(width)}  {table.target}")
    print(
        'Next: set [storage] engine = "postgres" in the config and start the daemon;'
        f" {source} is left as it was."
    )
    return 0


def backup_name(directory: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target = directory / f"echo-bot-{stamp}.sqlite3"
    n = 1
    while target.exists():  # more than one backup in the same second
        n += 1
        target = directory / f"echo-bot-{stamp}-{n}.sqlite3"
    return target


# -- pairing ------------------------------------------------------------------------------
def pair_command(loaded: LoadedConfig, at: StoreAt, environ: Mapping[str, str]) -> int:
    """``environ``: the environment with systemd credentials filled in (a token given
    only as a credential switches Telegram on too)."""
    from ..plugins import registry

    hints = {s.name: s.pair_hint for s in registry().specs.values() if s.pair_hint}
    pairing = [name for name in hints if channel_enabled(loaded, environ, name)]
    if not pairing:
        sections = ", ".join(f"[{name}]" for name in hints)
        how = f"set enabled = true under {sections} in {loaded.path}"
        if not loaded.from_file:
            hints_without = [
                spec.without_file(section)
                for spec in registry().specs.values()
                if spec.name in hints
                and spec.without_file is not None
                and (section := channel_section(loaded.config, spec.name)) is not None
            ]
            how = " or ".join([*hints_without, f"enable {sections} in a config file"])
        print(
            f"echo-bot: pair: no channel that pairs strangers ({', '.join(hints)}) is on,"
            f" so no code could be used ({how})",
            file=sys.stderr,
        )
        return 2
    code = _with_store(at, lambda tx: tx.access.new_pairing_code(), create=True)
    print(f"Pairing code: {code}")
    print("Valid for 10 minutes, once, on the channel it is sent on. Send it to the bot")
    for name in pairing:
        print(f"  {hints[name].format(code=code)}")
    print("A paired user may chat, never approve (approvers come only from the config).")
    return 0


def _configured(loaded: LoadedConfig, channels: list[str], user_id: str) -> str:
    """Where the config itself lets ``user_id`` chat, said when they are not paired."""
    for name in channels:
        section = channel_section(loaded.config, name)
        if section is not None and user_id in registry()[name].allowed_users(section):
            return f" (they are in [{name}] allowed_users: remove them there)"
    return ""


def pairings_command(loaded: LoadedConfig, at: StoreAt, action: str, user: str | None) -> int:
    if action == "list":
        rows = _listed(at, lambda tx: tx.access.paired_users())
        if not rows:
            print("No paired users.")
            return 0
        for row in rows:
            name = escape_text(row.name) if row.name else "(name unknown)"
            print(f"{row.channel}:{row.user_id}  {name}  paired {_clock(row.added_at)}")
        return 0
    if not user:
        print("echo-bot: pairings revoke needs a user id (see `echo-bot pairings list`)")
        return 2
    chats = [s.name for s in registry().specs.values() if s.chats]
    channel, _, rest = user.partition(":")  # a Matrix id has colons of its own
    named, user_id = ([channel], rest) if channel in chats else (chats, user)  # bare: any
    # One transaction for every channel named (a list, not any(): each is revoked).
    revoked = _with_store(at, lambda tx: [tx.access.revoke(name, user_id) for name in named])
    if not any(revoked):
        where = _configured(loaded, named, user_id)
        print(f"echo-bot: {user} is not a paired user{where}; nothing changed")
        return 1
    print(f"Revoked {user}: a running daemon refuses their next message.")
    return 0


# -- audit --------------------------------------------------------------------------------
def audit_command(at: StoreAt, tail: int, trace: str | None, *, usage: bool = False) -> int:
    if usage:
        return _usage(at)
    rows = _listed(at, lambda tx: tx.audit.read(tail=tail, trace_id=trace))
    if not rows:
        print("No audit rows." if trace is None else f"No audit rows for trace {trace}.")
    for row in rows:
        data = " ".join(
            f"{k}={_audit_value(v)}" for k, v in row.data.items() if v not in (None, "", [], {})
        )
        print(f"{_clock(row.ts)} {row.trace_id or '-'} {row.kind:<18} {data}")
    return 0


def _usage(at: StoreAt) -> int:
    rows = _listed(at, lambda tx: tx.audit.usage_by_day())
    if not rows:
        print("No LLM calls recorded.")
        return 0
    print(f"{'day':<10}  {'session':<24} {'model':<16} {'calls':>5} {'prompt':>8} "
          f"{'completion':>10} {'avg ms':>7}")  # fmt: skip
    for r in rows:
        print(
            f"{r.day:<10}  {r.session_key[:24]:<24} {r.model[:16]:<16} {r.calls:>5} "
            f"{r.prompt_tokens:>8} {r.completion_tokens:>10} {r.avg_latency_ms:>7.0f}"
        )
    return 0


def _audit_value(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 300 else text[:300] + "…"
