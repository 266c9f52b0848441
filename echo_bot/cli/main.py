"""The ``echo-bot`` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import EXIT_OUTPUT_CLOSED, EchoBotError
from ..secrets import Masker
from . import positive, webhook

if TYPE_CHECKING:
    from ..config import LoadedConfig
    from .admin import StoreAt

log = logging.getLogger("echo_bot")

# Learns the secrets once the config is read: an error that ends the command is masked too.
_ERRORS = Masker()


class _Commands(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose ``--help`` opens with the line the command list shows."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        text = kwargs.get("help")
        if text and "description" not in kwargs:
            kwargs["description"] = text[:1].upper() + text[1:] + "."
        return super().add_parser(name, **kwargs)  # type: ignore[no-any-return]


def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options every command takes, before or after its name. Only the top-level
    parser holds defaults: a subcommand's copy sets a value only when it is given there."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--config",
        type=Path,
        metavar="PATH",
        default=default(os.environ.get("ECHO_BOT_CONFIG") or None),
        help="TOML config file (default: $ECHO_BOT_CONFIG, else embedded defaults)",
    )
    parser.add_argument(
        "--state-dir", type=Path, metavar="DIR", default=default(None), help="where state lives"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default(False),
        help="log at [bot] log_level on stderr, also while the terminal chat is attached",
    )
    parser.add_argument(
        "--log-file",
        type=Path,
        metavar="PATH",
        default=default(None),
        help="write the log to this file, at [bot] log_level (stderr keeps warnings)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="echo-bot",
        description="A self-hosted bot host whose risky actions wait for your approval.",
        epilog="The options above work before or after the command, e.g. "
        "echo-bot --state-dir DIR status.",
    )
    parser.add_argument("--version", action="version", version=f"echo-bot {__version__}")
    _global_options(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, defaults=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", action=_Commands)
    sub.add_parser("run", parents=[common], help="run the daemon")
    sub.add_parser("chat", parents=[common], help="talk to the bot in this terminal")
    check = sub.add_parser(
        "check-config", parents=[common], help="validate the config and summarise it"
    )
    approvals = sub.add_parser("approvals", parents=[common], help="list and decide approvals")
    approvals.add_argument("action", choices=["list", "show", "approve", "deny"])
    approvals.add_argument(
        "id", nargs="?", help="the request id, or a unique prefix of it (6+ characters)"
    )
    approvals.add_argument(
        "--wait", type=float, default=10.0, help="seconds to wait for the daemon (default 10)"
    )
    sub.add_parser(
        "pair",
        parents=[common],
        help="print a one-time code that lets a stranger chat (on the networks that pair)",
    )
    pairings = sub.add_parser("pairings", parents=[common], help="list or revoke paired users")
    pairings.add_argument("action", choices=["list", "revoke"])
    pairings.add_argument("user", nargs="?", help="the user id to revoke (revoke)")
    sub.add_parser("status", parents=[common], help="what the daemon is doing (or was)")
    doctor = sub.add_parser(
        "doctor", parents=[common], help="check config, secrets, state dir, peers"
    )
    for reads_secrets in (check, doctor):
        reads_secrets.add_argument(
            "--env-file",
            type=Path,
            help="read secrets from the service's environment file too (systemd EnvironmentFile=)",
        )
    backup = sub.add_parser("backup", parents=[common], help="a consistent copy of the store")
    backup.add_argument(
        "path", type=Path, help="where to write the copy (a directory: a new, timestamped file)"
    )
    backup.add_argument(
        "--force", action="store_true", help="replace PATH if it is an existing file"
    )
    webhook.add_commands(sub, common)
    store = sub.add_parser("store", parents=[common], help="move the store to another engine")
    store_sub = store.add_subparsers(
        dest="store_command", required=True, metavar="ACTION", action=_Commands
    )
    copy = store_sub.add_parser(
        "copy",
        parents=[common],
        help="copy a stopped SQLite store into an empty PostgreSQL database",
    )
    copy.add_argument("--to", required=True, choices=["postgres"], help="the target engine")
    console = sub.add_parser(
        "console", parents=[common], help="sign-in links to the web console; its sessions"
    )
    console_sub = console.add_subparsers(
        dest="console_command", required=True, metavar="ACTION", action=_Commands
    )
    link = console_sub.add_parser(
        "link", parents=[common], help="print a one-time sign-in link (refused while it is off)"
    )
    link.add_argument(
        "--as",
        dest="as_",
        metavar="CHANNEL:ID",
        help="for this approver, as its channel writes them (default: you, the owner)",
    )
    sessions = console_sub.add_parser(
        "sessions", parents=[common], help="the live sessions: who, since when, which browser"
    )
    sessions.add_argument("--all", action="store_true", help="ended ones too, and how they ended")
    revoke = console_sub.add_parser(
        "revoke", parents=[common], help="end a session now, or every live one"
    )
    revoke.add_argument(
        "id", nargs="?", help="the session id, or a unique prefix of it (6+ characters)"
    )
    revoke.add_argument("--all", action="store_true", help="end every live session")
    mcp = sub.add_parser("mcp", parents=[common], help="the MCP servers and their tools")
    mcp_sub = mcp.add_subparsers(
        dest="mcp_command", required=True, metavar="ACTION", action=_Commands
    )
    mcp_sub.add_parser(
        "list", parents=[common], help="each server's state, its tools, their risk and its source"
    )
    reminders = sub.add_parser("reminders", parents=[common], help="list or cancel reminders")
    reminders.add_argument("action", choices=["list", "cancel"])
    reminders.add_argument("id", nargs="?", help="the reminder id (cancel)")
    history = sub.add_parser("history", parents=[common], help="what the model reads of a chat now")
    history.add_argument("chat", help="the chat, as its address reads (CHANNEL:CHAT)")
    memory = sub.add_parser(
        "memory", parents=[common], help="list or forget the chats' memory notes"
    )
    memory.add_argument("action", choices=["list", "forget"])
    memory.add_argument("target", nargs="?", help="a chat (list: its notes only) or a note id")
    audit = sub.add_parser("audit", parents=[common], help="print the audit log")
    audit.add_argument("--tail", type=positive, default=50, help="the last N entries (default 50)")
    audit.add_argument("--trace", help="every entry of one trace id")
    audit.add_argument(
        "--usage", action="store_true", help="LLM tokens and latency per day and session"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    # First of all: every echo-bot process holds the secrets of its environment (and,
    # after start, of its credentials); no other process of this user may read them.
    from ..hardening import make_non_dumpable

    hidden = make_non_dumpable()
    args = _parser().parse_args(argv)
    if not hidden and args.command in ("run", "chat"):
        print(
            "echo-bot: warning: cannot mark this process non-dumpable (not Linux?); "
            "processes of the same user may read its secrets",
            file=sys.stderr,
        )
    try:
        return _dispatch(args)
    except EchoBotError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"echo-bot: {_ERRORS.mask(line)}", file=sys.stderr)
        return exc.exit_code
    except PermissionError as exc:  # most often: run as another user than the daemon's
        where = f" ({exc.filename})" if exc.filename else ""
        print(
            f"echo-bot: permission denied{where}: run this as the user the daemon runs as"
            " (for the systemd unit: sudo -u echo-bot echo-bot …)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`echo-bot audit | head -1`): stop quietly with the status
        # of a process killed by SIGPIPE, as other Unix tools do.
        _discard_stdout()
        return EXIT_OUTPUT_CLOSED


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is still
    buffered cannot fail on the closed pipe ("Exception ignored … BrokenPipeError")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


def _dispatch(args: argparse.Namespace) -> int:
    from ..config import load_config, secret_env_names, with_credentials
    from ..logs import setup_logging
    from ..secrets import masked_output
    from ..statedir import resolve_state_dir

    if args.command == "doctor":
        return _doctor(args)
    if args.command in ("run", "chat", "check-config"):
        from ..plugins import registry

        registry().check()  # a broken channel plugin: named, exit 2
    loaded = load_config(args.config)
    config = loaded.config
    given: Mapping[str, str] = os.environ
    if getattr(args, "env_file", None) is not None:  # check-config as the service sees it
        from .doctor import environ_with_file

        given = environ_with_file(os.environ, args.env_file)
    environ = with_credentials(config, given)
    masker = Masker.from_environment(secret_env_names(config), environ)
    _ERRORS.add(environ.get(name, "") for name in secret_env_names(config))
    state_dir = resolve_state_dir(args.state_dir, config.bot.state_dir, environ)
    if args.command in ("run", "chat"):
        # When the terminal chat shares its screen with stderr, only warnings and errors
        # interrupt it, unless asked for (--verbose); --log-file gets everything.
        quiet = _chat_on_the_log_screen(args.command) or args.log_file is not None
        setup_logging(
            config.bot.log_level,
            config.bot.log_format,
            masker,
            stderr_level="WARNING" if quiet and not args.verbose else None,
            log_file=args.log_file,
        )
        return _run_daemon(args.command, loaded, state_dir, environ)
    setup_logging("INFO" if args.verbose else "WARNING", "text", masker, log_file=args.log_file)
    with masked_output(masker):
        return _manage(args, loaded, state_dir, environ)


def _manage(
    args: argparse.Namespace, loaded: LoadedConfig, state_dir: Path, environ: dict[str, str]
) -> int:
    """The management commands: they work beside a running daemon."""
    if args.command == "check-config":
        from .admin import check_config

        return check_config(loaded, state_dir, environ)
    if args.command == "store":
        from .admin import store_copy_command

        return store_copy_command(loaded, state_dir, environ, args.to)
    if args.command == "mcp":
        from ..mcp.listing import mcp_list_command

        return mcp_list_command(loaded, environ)
    handler = getattr(args, "handler", None)
    if handler is not None:  # a command that says its own (webhook.add_commands)
        from .admin import CommandContext

        return int(handler(args, CommandContext(loaded, state_dir, environ)))
    from .admin import StoreAt

    at = StoreAt.of(loaded, state_dir, environ)  # the state dir's file, or PostgreSQL
    if args.command == "approvals":
        from .admin import approvals_command

        return approvals_command(at, args.action, args.id, args.wait)
    if args.command == "status":
        from .admin import status_command

        return status_command(at, loaded.config)
    if args.command == "backup":
        from .admin import backup_command

        return backup_command(at, args.path, force=args.force)
    if args.command == "reminders":
        from .admin import reminders_command

        return reminders_command(at, args.action, args.id)
    if args.command == "history":
        from .admin import history_command

        return history_command(at, loaded, environ, args.chat)
    if args.command == "memory":
        from .admin import memory_command

        return memory_command(at, args.action, args.target)
    if args.command == "pair":
        from .admin import pair_command

        return pair_command(loaded, at, environ)
    if args.command == "pairings":
        from .admin import pairings_command

        return pairings_command(loaded, at, args.action, args.user)
    if args.command == "console":
        return _console(args, loaded, at)
    if args.command == "audit":
        from .admin import audit_command

        return audit_command(at, args.tail, args.trace, usage=args.usage)
    raise AssertionError(args.command)


def _console(args: argparse.Namespace, loaded: LoadedConfig, at: StoreAt) -> int:
    from .console import link_command, revoke_command, sessions_command

    if args.console_command == "link":
        return link_command(loaded, at, args.as_)
    if args.console_command == "sessions":
        return sessions_command(at, every=args.all)
    return revoke_command(at, args.id, every=args.all)


def _doctor(args: argparse.Namespace) -> int:
    from ..config import Config, load_config, secret_env_names, with_credentials
    from ..logs import setup_logging
    from ..plugins import registry
    from ..secrets import masked_output
    from ..statedir import resolve_state_dir
    from .doctor import environ_with_file, run_doctor

    loaded: LoadedConfig | EchoBotError
    try:
        registry().check()
        loaded = load_config(args.config)
        config, config_dir = loaded.config, loaded.config.bot.state_dir
    except EchoBotError as exc:
        loaded, config, config_dir = exc, Config(), None
    base = environ_with_file(os.environ, args.env_file)
    try:
        environ = with_credentials(config, base)
    except EchoBotError as exc:
        loaded, environ = exc, base
    masker = Masker.from_environment(secret_env_names(config), environ)
    setup_logging("INFO" if args.verbose else "ERROR", "text", masker, log_file=args.log_file)
    state_dir = resolve_state_dir(args.state_dir, config_dir, environ)
    source = str(args.config) if args.config else "embedded defaults"
    with masked_output(masker):
        return run_doctor(loaded, source, state_dir, environ)


def _run_daemon(
    command: str, loaded: LoadedConfig, state_dir: Path, environ: dict[str, str]
) -> int:
    from ..app import Daemon
    from ..config import channel_enabled, channel_names
    from ..plugins import local_channel
    from ..runtime import build

    runtime = build(loaded, state_dir, environ)
    tty = _stdin_is_terminal()
    channels: list[str] = []
    options: dict[str, dict[str, object]] = {}
    terminal = local_channel()
    if command == "chat":
        channels.append(terminal)
        options[terminal] = {"interactive": tty, "exit_on_eof": True}
    else:
        if tty:
            channels.append(terminal)
            options[terminal] = {"interactive": True, "exit_on_eof": False}
        channels += [
            name
            for name in channel_names()
            if name != terminal and channel_enabled(loaded, environ, name)
        ]
    daemon = Daemon(
        runtime,
        channel_names=channels,
        channel_options=options,
        banner=True,
        freeze_heap=True,
        wait_for_mcp=command == "chat" and not tty,
    )
    return asyncio.run(daemon.run())


def _stdin_is_terminal() -> bool:
    return sys.stdin is not None and sys.stdin.isatty()


def _chat_on_the_log_screen(command: str) -> bool:
    """Whether the terminal chat is attached (see ``_run_daemon``) and stderr, where the
    log goes, is a terminal too: the screen the chat is read on."""
    attached = command == "chat" or _stdin_is_terminal()
    return attached and sys.stderr is not None and sys.stderr.isatty()


def format_ts(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
