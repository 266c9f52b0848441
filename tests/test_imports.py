"""The import directions of docs/ARCHITECTURE.md, and what a plain run must never import."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, echo_bot_env

CORE = ROOT / "echo_bot"
CHANNELS = ROOT / "channels"

# Modules of the core that are leaves: stdlib and pydantic, nothing else of ours but
# other leaves.
LEAVES = {
    "echo_bot.events",
    "echo_bot.errors",
    "echo_bot.conversation",
    "echo_bot.durations",
    "echo_bot.dates",
    "echo_bot.sizes",
    "echo_bot.statuses",
    "echo_bot.sections",
}
LEAF_ALLOWED_THIRD_PARTY = {"pydantic"}
# What a channel may import from the core: its public API.
CHANNEL_API = {
    "echo_bot.background",  # a part's background tasks, cancelled together
    "echo_bot.chat_sends",  # sending to a network whose messages can be edited
    "echo_bot.dates",
    "echo_bot.downloads",  # a person's file fetched during the turn, whole or not at all
    "echo_bot.events",
    "echo_bot.bus",
    "echo_bot.config",
    "echo_bot.edge",  # the inbound edge: allowlist, pairing, refusals, the commit
    "echo_bot.errors",
    "echo_bot.http_deliveries",  # the route of a network that POSTs its events
    "echo_bot.in_order",  # deliveries pushed down one connection: committed, then acked
    "echo_bot.link",  # a channel's connection to its peer as the host keeps it
    "echo_bot.plugins",  # a channel's spec: what the core knows of it
    "echo_bot.pacing",  # how fast a channel sends: budgets per chat and account
    "echo_bot.probe",  # one bounded HTTP request, for a channel's doctor checks
    "echo_bot.preview_ledger",  # preview messages up, noted: what a kill left is removed
    "echo_bot.prompt_answers",  # prompts on a network without buttons: how to answer
    "echo_bot.rate_limits",  # "too many requests": a short wait waited out, a long one paced
    "echo_bot.richtext",  # the outgoing-text pipeline every channel's text passes
    "echo_bot.sections",  # config sections: value types, what every chat section holds
    "echo_bot.sizes",
    "echo_bot.statuses",
}
# Libraries the core must import lazily (inside functions), never at module level…
LAZY_ONLY = {"aiogram", "nio", "slack_sdk", "openai", "aiohttp", "apscheduler", "psycopg", "jinja2"}
# …except in modules that are themselves only imported inside functions.
LAZY_MODULES = {
    "echo_bot.http",
    "echo_bot.tools.builtin.web_guard",
    "echo_bot.store.postgres",
    "echo_bot.store.copy",
    # The web console's HTTP side, imported by app.py only when [console] enabled.
    "echo_bot.console.web",
    "echo_bot.console.security",
    "echo_bot.console.render",
}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, *, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    )
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            for alias in node.names:  # `from . import x` may name a module
                found.add(f"{target}.{alias.name}")
    return found


def python_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def ours(name: str) -> bool:
    return name.split(".")[0] in {"echo_bot", "channels"}


def test_core_never_imports_channels() -> None:
    offenders = [
        (module_name(p), name)
        for p in python_files(CORE)
        for name in imports_of(p)
        if name == "channels" or name.startswith("channels.")
    ]
    assert offenders == []


def test_channels_use_only_the_public_core_api() -> None:
    offenders = []
    for path in python_files(CHANNELS):
        for name in imports_of(path):
            if name.startswith("echo_bot") and not any(
                name == api or name.startswith(api + ".") for api in CHANNEL_API
            ):
                offenders.append((module_name(path), name))
    assert offenders == []


def test_leaves_import_only_leaves_and_pydantic() -> None:
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    offenders = []
    for leaf in LEAVES | {"echo_bot.bus"}:
        path = ROOT / (leaf.replace(".", "/") + ".py")
        for name in imports_of(path):
            top = name.split(".")[0]
            if top in stdlib or top in LEAF_ALLOWED_THIRD_PARTY:
                continue
            module = name if name in LEAVES else name.rpartition(".")[0]
            if ours(name) and (name in LEAVES or module in LEAVES):
                continue
            offenders.append((leaf, name))
    assert offenders == []


def test_store_does_not_depend_on_agent_or_app() -> None:
    upper = (
        "echo_bot.agent",
        "echo_bot.app",
        "echo_bot.brains",
        "echo_bot.approvals",
        "echo_bot.cli",
    )
    offenders = [
        (module_name(p), name)
        for p in python_files(CORE / "store")
        for name in imports_of(p)
        if name.startswith(upper)
    ]
    assert offenders == []


def test_only_the_entry_point_imports_the_management_cli() -> None:
    """echo_bot/cli/ (the command, admin, doctor) is the top: the daemon's parts never
    reach into it."""
    offenders = [
        (module_name(p), name)
        for p in python_files(CORE)
        if not module_name(p).startswith("echo_bot.cli") and module_name(p) != "echo_bot.__main__"
        for name in imports_of(p)
        if name == "echo_bot.cli" or name.startswith("echo_bot.cli.")
    ]
    assert offenders == []


def test_commands_never_import_the_brains() -> None:
    """Commands answer with the ``conversation`` leaf's types and the runner asks them
    before any brain; the brains (the rules brain lists the commands) may use the
    registry, never the other way round."""
    offenders = [
        (module_name(p), name)
        for folder in (CORE / "commands", CORE / "scheduling", CORE / "media")
        for p in python_files(folder)
        for name in imports_of(p)
        if name == "echo_bot.brains" or name.startswith("echo_bot.brains.")
    ]
    assert offenders == []


def package_of(name: str) -> str | None:
    """The node of the package graph ``name`` belongs to: ``echo_bot.<sub-package>``, or
    ``echo_bot.<module>`` for a top-level module; None outside the core (or for the
    ``echo_bot`` package itself)."""
    parts = name.split(".")
    if parts[0] != "echo_bot" or len(parts) < 2:
        return None
    return f"echo_bot.{parts[1]}"


def package_graph() -> dict[str, dict[str, set[str]]]:
    """``{package: {package it imports: {the modules that do}}}``, read from the source:
    every import, at module level or inside a function (or under TYPE_CHECKING)."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in python_files(CORE):
        source = package_of(module_name(path))
        if source is None:
            continue
        targets = graph.setdefault(source, {})
        for name in imports_of(path):
            target = package_of(name)
            if target is not None and target != source:
                targets.setdefault(target, set()).add(module_name(path))
    return graph


def find_cycle(graph: dict[str, dict[str, set[str]]]) -> list[str] | None:
    """A cycle of ``graph`` as the packages along it (the first again at the end), or
    None when it is a DAG (depth-first search, white/grey/black)."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph.get(node, {})):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done:
                found = visit(target)
                if found is not None:
                    return found
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for node in sorted(graph):
        if node not in done:
            found = visit(node)
            if found is not None:
                return found
    return None


def describe_cycle(graph: dict[str, dict[str, set[str]]], cycle: list[str]) -> str:
    return "; ".join(
        f"{a} -> {b} (in {', '.join(sorted(graph[a][b]))})" for a, b in itertools.pairwise(cycle)
    )


def test_the_package_import_graph_is_a_dag() -> None:
    """Packages (``echo_bot.brains``, ``echo_bot.tools``, …; a top-level module is a
    package of its own) import each other in one direction only."""
    graph = package_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + describe_cycle(graph, cycle)


def test_a_cycle_is_found_and_named() -> None:
    """The check itself: a cycle three packages long is reported along its edges."""
    graph = {
        "echo_bot.a": {"echo_bot.b": {"echo_bot.a.x"}},
        "echo_bot.b": {"echo_bot.c": {"echo_bot.b.y"}, "echo_bot.d": {"echo_bot.b"}},
        "echo_bot.c": {"echo_bot.a": {"echo_bot.c.z"}},
    }
    cycle = find_cycle(graph)
    assert cycle == ["echo_bot.a", "echo_bot.b", "echo_bot.c", "echo_bot.a"]
    assert describe_cycle(graph, cycle) == (
        "echo_bot.a -> echo_bot.b (in echo_bot.a.x); echo_bot.b -> echo_bot.c (in "
        "echo_bot.b.y); echo_bot.c -> echo_bot.a (in echo_bot.c.z)"
    )
    assert find_cycle({"echo_bot.a": {"echo_bot.b": {"echo_bot.a"}}}) is None


def test_scheduling_stays_below_the_agent_and_the_composition_root() -> None:
    upper = ("echo_bot.agent", "echo_bot.app", "echo_bot.runtime", "echo_bot.cli", "channels")
    offenders = [
        (module_name(p), name)
        for p in python_files(CORE / "scheduling")
        for name in imports_of(p)
        if name.startswith(upper)
    ]
    assert offenders == []


def test_only_app_knows_the_channel_registry() -> None:
    offenders = [
        module_name(p)
        for p in python_files(CORE)
        if '"channels.' in p.read_text() and module_name(p) != "echo_bot.app"
    ]
    assert offenders == []


def test_heavy_sdks_are_never_imported_at_module_level_by_the_core() -> None:
    offenders = [
        (module_name(p), name)
        for p in python_files(CORE)
        if module_name(p) not in LAZY_MODULES
        for name in imports_of(p, top_level_only=True)
        if name.split(".")[0] in LAZY_ONLY or name in LAZY_MODULES
    ]
    assert offenders == []


def test_a_run_without_telegram_llm_or_postgres_never_imports_their_sdks(tmp_path: Path) -> None:
    """Start the real daemon on embedded defaults, then look at sys.modules."""
    script = f"""
import asyncio, os, sys
from pathlib import Path
from echo_bot.app import Daemon
from echo_bot.runtime import build
from echo_bot.config import load_config

async def main():
    runtime = build(load_config(None), Path({str(tmp_path / "st")!r}), os.environ)
    daemon = Daemon(runtime, channel_names=[], banner=False)
    task = asyncio.create_task(daemon.run())
    await daemon.wait_started()
    daemon.request_stop()
    await task

asyncio.run(main())
# The scheduler (APScheduler, ~50 ms) always runs: reminders can be set at any time.
lazy = {{"aiogram", "nio", "slack_sdk", "openai", "aiohttp", "dateparser", "psycopg", "jinja2"}}
heavy = sorted(m for m in sys.modules if m.split(".")[0] in lazy)
print("HEAVY:", ",".join(heavy))
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=echo_bot_env(),
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "HEAVY: \n" in result.stdout or result.stdout.strip() == "HEAVY:", result.stdout
