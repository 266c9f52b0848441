"""The channels echo-bot can run, found as plugins: each is a ``ChannelSpec`` registered
under the ``echo_bot.channels`` entry point group — the built-in channels too
(``channels/specs.py``, named in pyproject.toml). The core's per-channel questions
(which class, which extra installs its library, is it switched on, does it need the
HTTP server, whose ids may chat or approve, which of its chats are direct, how long an
external id stays unique, which secrets it reads, how a stranger sends a pairing code)
are lookups here, never tables naming channels.

A plugin that is broken — its entry point cannot be imported, what it names is not a
``ChannelSpec`` or names another channel than its entry point, or two installed packages
claim one name — is reported by ``check-config``, ``doctor`` and ``run`` (exit 2, one
line each: ``Registry.broken``) and is not loaded. A plugin runs inside the daemon
with the daemon's trust (docs/SECURITY.md).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from . import events
from .errors import ConfigError

GROUP = "echo_bot.channels"


def _nothing(section: Any) -> Collection[str]:
    return ()


def _chat_enabled(section: Any, environ: Mapping[str, str], from_file: bool) -> bool:
    return bool(section.enabled)


def _chat_users(section: Any) -> Collection[str]:
    return {str(user) for user in section.allowed_users}


def _chat_approvers(section: Any) -> Collection[str]:
    return {str(user) for user in section.approver_ids}


def _no_secrets(section: Any, environ: Mapping[str, str]) -> list[tuple[str, bool]]:
    return []


@dataclass(frozen=True)
class Trigger:
    """What a channel's section makes act on its own, as a cron job does (a webhook's
    route): the core checks that its tool exists and that ``deliver_to`` names a
    channel, and shows where its approval prompts go."""

    key: str  # where in the section (``routes[0]``)
    who: str  # what people call it (``route deploy``)
    tool: str | None = None
    deliver_to: str | None = None


@dataclass(frozen=True)
class ChannelSpec:
    """What the core knows of one channel; everything else is the channel's own."""

    name: str  # its config section's name and its addresses' first part (``name:chat``)
    target: str  # "module:Class" of the channel, imported only when it runs
    # The pip extra that brings its library (``pip install 'echo-bot[NAME]'``), or for
    # a channel from another package, that package's name; None: nothing to install.
    install: str | None = None
    prefix: str = "/"  # what its commands start with as people type them (``!`` on Slack)
    # Seconds an external id stays unique (a network that reuses ids after a while);
    # None: the inbox's default.
    dedupe_window: float | None = None
    # Whether its chat ids say which chat is a person's own with the bot (Telegram: a
    # private chat's id is its user's, a group's is negative).
    ids_tell_direct: bool = False
    # Whether its chat ids hold colons of their own (a Matrix room, ``!opaque:server``):
    # the rest of an address ``name:…`` is then the chat id, never ``chat:thread``.
    colons_in_chat_ids: bool = False
    # Whether its one person is the owner at the daemon's machine (the terminal): they
    # approve there, and read the machine's files.
    local: bool = False
    # Whether what comes in on it is sent by a program, not a person (a webhook's
    # route): no sign-in link, no pairing, no one to ask.
    machine: bool = False
    # How ``echo-bot pair`` tells a stranger to send the code ("{code}" filled in);
    # None: the channel takes no pairing codes.
    pair_hint: str | None = None
    # A user id as its allowlist writes it, for help texts (``CHANNEL:ID``, like
    # ``telegram:12345``); None: it has no one who signs in or approves.
    example_id: str | None = None
    # Whether it runs, given its section, the environment and whether a config file
    # was read (None: a ``ChatSection``'s ``enabled``; with no section, it runs when
    # asked, as the terminal does).
    enabled: Callable[[Any, Mapping[str, str], bool], bool] | None = None
    # How it is switched on when no config file is read, said to someone who needs it on
    # (Telegram: "set $TELEGRAM_BOT_TOKEN"); None: only by its section in a file.
    without_file: Callable[[Any], str] | None = None
    # Why it needs the daemon's HTTP server with this section (None: it does not).
    http_reason: Callable[[Any], str | None] = lambda section: None
    # The people its section lets chat, and approve (ids as its addresses carry them);
    # a ``ChatSection``'s ``allowed_users`` and ``approver_ids`` when left out.
    allowed_users: Callable[[Any], Collection[str]] = _nothing
    approvers: Callable[[Any], Collection[str]] = _nothing
    # The secret variables it reads while enabled: (name, needed); and every variable
    # its section names as holding a secret, enabled or not (all are masked).
    secrets_in_use: Callable[[Any, Mapping[str, str]], list[tuple[str, bool]]] = _no_secrets
    secret_names: Callable[[Any], list[str]] = lambda section: []
    # What its enabled section's environment lacks or holds wrong, each "key: why"
    # (the key under its section); None: each needed secret of ``secrets_in_use`` set.
    environment_problems: Callable[[Any, Mapping[str, str], Path | None], list[str]] | None = None
    # What its section makes act on its own (a webhook's routes).
    triggers: Callable[[Any], list[Trigger]] = lambda section: []
    # What ``check-config`` says of it when it is on, after its name (default "on").
    summary: Callable[[Any], str] = lambda section: "on"
    # Keys of its section a reload (SIGHUP) takes live; the others need a restart (a
    # ``ChatSection``: who chats and approves, when left out).
    live_keys: frozenset[str] = field(default_factory=frozenset)
    # The pydantic model of its ``[name]`` section (pure pydantic, unknown keys
    # forbidden: importable without the channel's network library); None: the core's
    # Config has its section (the webhook's routes), or it has none (the terminal).
    config_model: type[Any] | None = None

    def problems(
        self, section: Any, environ: Mapping[str, str], state_dir: Path | None
    ) -> list[str]:
        """``environment_problems``, or by default each needed secret that is not set."""
        if self.environment_problems is not None:
            return self.environment_problems(section, environ, state_dir)
        keys = {value: key for key, value in section if isinstance(value, str)}
        return [
            f"{keys.get(variable, 'secrets')}: environment variable {variable} is not set"
            f" (a secret the {self.name} channel reads)"
            for variable, needed in self.secrets_in_use(section, environ)
            if needed and not environ.get(variable)
        ]

    def __post_init__(self) -> None:
        """A section that is a ``ChatSection`` says whether it is on, who chats and
        approves, and what a reload takes live: a spec that leaves them out gets them."""
        from .sections import LIVE_KEYS, ChatSection

        model = self.config_model
        if not (isinstance(model, type) and issubclass(model, ChatSection)):
            return
        given: dict[str, tuple[Any, Any]] = {
            "enabled": (None, _chat_enabled),
            "allowed_users": (_nothing, _chat_users),
            "approvers": (_nothing, _chat_approvers),
            "live_keys": (frozenset(), LIVE_KEYS),
        }
        for key, (unset, value) in given.items():
            if getattr(self, key) == unset:
                object.__setattr__(self, key, value)

    @property
    def chats(self) -> bool:
        """Whether people chat on it under an allowlist (a chat network, not the
        terminal nor a webhook)."""
        return self.pair_hint is not None


@dataclass(frozen=True)
class Registry:
    """The installed channels by name, and the plugins that could not be loaded."""

    specs: Mapping[str, ChannelSpec]
    broken: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> ChannelSpec:
        spec = self.specs.get(name)
        if spec is None:
            raise ConfigError(
                f"no channel named {name!r} is installed (installed: {self.names_text})"
            )
        return spec

    def get(self, name: str) -> ChannelSpec | None:
        return self.specs.get(name)

    @property
    def names(self) -> list[str]:
        return sorted(self.specs)

    @property
    def names_text(self) -> str:
        return ", ".join(self.names)

    def check(self) -> None:
        """``ConfigError`` naming every broken plugin (``run``, ``check-config`` and
        ``doctor`` stop on it: a channel the owner installed must not vanish silently)."""
        if self.broken:
            raise ConfigError("; ".join(self.broken))


def _loaded(point: EntryPoint) -> tuple[ChannelSpec | None, str | None]:
    where = f"{point.value} ({_distribution(point)})"
    try:
        spec = point.load()
    except Exception as exc:  # a plugin's import may fail any way: it is reported
        return None, f"channel plugin {point.name!r} from {where} cannot be loaded: {exc!r}"
    if not isinstance(spec, ChannelSpec):
        return None, f"channel plugin {point.name!r} from {where} is not a ChannelSpec"
    if spec.name != point.name:
        return None, (
            f"channel plugin {point.name!r} from {where} names itself {spec.name!r}:"
            " the entry point's name and the spec's must agree"
        )
    return spec, None


def _distribution(point: EntryPoint) -> str:
    dist = getattr(point, "dist", None)
    return f"package {dist.name}" if dist is not None else "an unknown package"


def build(points: Collection[EntryPoint]) -> Registry:
    claimed: dict[str, list[EntryPoint]] = {}
    for point in points:
        claimed.setdefault(point.name, []).append(point)
    specs: dict[str, ChannelSpec] = {}
    broken: list[str] = []
    for name, found in sorted(claimed.items()):
        sources = {_distribution(p) for p in found}
        if len(sources) > 1:
            broken.append(
                f"channel {name!r} is claimed by more than one installed package"
                f" ({', '.join(sorted(sources))}): uninstall all but one"
            )
            continue
        spec, why = _loaded(found[0])
        if spec is not None:
            specs[name] = spec
        else:
            broken.append(str(why))
    return Registry(specs, tuple(broken))


@functools.cache
def registry() -> Registry:
    """The installed channels (read once per process)."""
    return build(list(entry_points(group=GROUP)))


def _says(channel: str, flag: str) -> bool:
    """Whether ``channel``'s spec sets ``flag`` (an unknown channel sets none)."""
    spec = registry().get(channel)
    return spec is not None and bool(getattr(spec, flag))


def ids_tell_direct(channel: str) -> bool:
    """Whether ``channel``'s chat ids say which chat is a person's own with the bot."""
    return _says(channel, "ids_tell_direct")


def is_local(channel: str) -> bool:
    """Whether ``channel``'s person is the owner at the daemon's machine (the terminal)."""
    return _says(channel, "local")


def is_machine(channel: str) -> bool:
    """Whether what comes in on ``channel`` is sent by a program (a webhook's route)."""
    return _says(channel, "machine")


def _whole_chat_id(channel: str) -> bool:
    return _says(channel, "colons_in_chat_ids")


events.whole_chat_id = _whole_chat_id  # how Address.parse reads such a channel's addresses


def command_prefix(channel: str) -> str:
    """What commands start with as people type them on ``channel`` (``/``, ``!`` on
    Slack): what the core's answers say (``/help``, an unknown command's reply)."""
    spec = registry().get(channel)
    return spec.prefix if spec is not None else "/"


def local_channel() -> str:
    """The name of the channel whose person is the owner at the machine (the terminal,
    ``ChannelSpec.local``): where ``echo-bot chat`` talks, and what the owner's own
    decisions at the server are recorded under."""
    found = [spec.name for spec in registry().specs.values() if spec.local]
    if len(found) != 1:
        raise ConfigError(f"one local channel (the terminal) is needed; installed: {found}")
    return found[0]


def example_ids() -> str:
    """``CHANNEL:ID`` as each installed channel writes an approver (for help texts)."""
    specs = registry().specs.values()
    return ", ".join(f"{s.name}:{s.example_id}" for s in specs if s.example_id) or "CHANNEL:ID"


def load_class(name: str) -> Any:
    """The class of channel ``name``, its module imported now. A library it needs that
    is not installed is a ``ConfigError`` saying how to install it."""
    spec = registry()[name]
    module_name, _, class_name = spec.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        own = module_name.split(".")[0]
        if (exc.name or "").split(".")[0] in (own, "echo_bot"):
            raise  # the channel's own code is broken: not a missing library
        raise ConfigError(missing_library(spec, exc)) from None
    return getattr(module, class_name)


def missing_library(spec: ChannelSpec, exc: ImportError) -> str:
    if spec.install is None:
        install = "install echo-bot again (pip install echo-bot, or pip install . in a checkout)"
    elif spec.install.startswith("echo-bot["):
        extra = spec.install.removeprefix("echo-bot[").rstrip("]")
        install = f"pip install '{spec.install}', or pip install '.[{extra}]' in a checkout"
    else:
        install = f"pip install '{spec.install}'"
    return f"[{spec.name}] is enabled but its library is not installed ({exc.name}): {install}"
