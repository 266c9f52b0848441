"""One store boundary (docs/ARCHITECTURE.md, "Storage"): nothing outside ``echo_bot/store/`` depends
on SQLite. Every module of the core and the channels is read with ``ast``; none may
import the driver (sqlite3, sqlite_utils), hold a string that is SQL, name a table where
a database handle takes one (``db["inbox"]``, ``db.table("inbox")``), or import a store
module's SQL functions. From ``echo_bot.store`` a module takes the package's own names;
from its modules only row types and constants.

A table's name alone is no finding: "approvals" and "audit" are also commands and config
sections, "messages" and "tool_calls" fields of the OpenAI API. Without the driver, SQL
or the store's functions, a table is only reached through a handle's subscript or its
methods that take a table or SQL, so that is where a table's name is looked for."""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import re
from pathlib import Path
from typing import cast

import pytest

from tests.conftest import ROOT

STORE = ROOT / "echo_bot" / "store"
CHECKED = (ROOT / "echo_bot", ROOT / "channels")
DRIVERS = {"sqlite3", "sqlite_utils"}


# Upper case only: prose ("select one from the list", "update the config and set …")
# is no SQL; lower-case SQL would name a table, which is caught on its own.
SQL = re.compile(
    r"\bSELECT\b[\s\S]*\bFROM\b|\bINSERT\s+(OR\s+\w+\s+)?INTO\b|\bUPDATE\s+\w+\s+SET\b"
    r"|\bDELETE\s+FROM\b|\b(CREATE|DROP|ALTER)\s+(TABLE|INDEX|VIEW|TRIGGER)\b|\bPRAGMA\b"
    r"|^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b"
)
# sqlite-utils' Database methods whose first argument is a table's name (or SQL).
HANDLE_METHODS = {
    "table",
    "create_table",
    "create_view",
    "execute",
    "executemany",
    "executescript",
    "query",
}
# What only the store may reach: the engine under a Store, a repository's connection.
PRIVATE_ATTRIBUTES = {"database", "_db", "_conn", "_loop_conn", "_wrapped"}
_CREATE_TABLE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)


def store_tables() -> frozenset[str]:
    """Every table ``store/schema.py`` creates, read from its SQL."""
    tree = ast.parse((STORE / "schema.py").read_text())
    return frozenset(
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        for name in _CREATE_TABLE.findall(node.value)
    )


def _absolute(module: str | None, level: int, package: str) -> str:
    if not level:
        return module or ""
    base = package.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _package_of(path: Path) -> str:
    """The package a relative import in ``path`` starts from (an ``__init__.py``'s own)."""
    return ".".join(path.relative_to(ROOT).parts[:-1])


def _store_name_allowed(module: str, name: str) -> bool:
    """``from module import name``, ``module`` in the store: the package's own names; a
    store module's row types (dataclasses), enums and public constants that are no SQL."""
    if module == "echo_bot.store":
        return name in importlib.import_module(module).__all__
    if name.startswith("_"):
        return False
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return False
    if inspect.isclass(value):
        return dataclasses.is_dataclass(value) or issubclass(value, enum.Enum)
    if isinstance(value, str) and _is_sql(value, frozenset()):
        return False
    return not (callable(value) or inspect.ismodule(value))


def _store_modules() -> frozenset[str]:
    return frozenset(path.stem for path in STORE.glob("*.py") if path.stem != "__init__")


def _is_sql(text: str, tables: frozenset[str]) -> bool:
    """Upper-case SQL, or SQL of any case that reaches one of ``tables``."""
    if SQL.search(text):
        return True
    if not tables:
        return False
    named = "|".join(sorted(tables))
    return re.search(rf"\b(from|into|update|join|table)\s+({named})\b", text, re.I) is not None


def _folded(node: ast.AST) -> str | None:
    """The text of a string built with ``+`` from literals (and f-strings), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            cast(str, v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _folded(node.left), _folded(node.right)
        if left is not None and right is not None:
            return left + right
    return None


def _holds_text(node: ast.AST) -> bool:
    """Whether a string literal goes into ``node`` (``q + "…"``, ``f"…"``, ``"…"``)."""
    return any(
        isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str))
        for n in ast.walk(node)
    )


def _names_the_store_package(node: ast.AST) -> bool:
    """``store`` or ``<anything>.store`` (``echo_bot.store``, ``core.store`` …)."""
    return (isinstance(node, ast.Name) and node.id == "store") or (
        isinstance(node, ast.Attribute) and node.attr == "store"
    )


def _in_store(module: str) -> bool:
    return module == "echo_bot.store" or module.startswith("echo_bot.store.")


def _names_a_table_to_a_handle(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """``x["name"]`` or ``x.table("name", …)`` (and the other HANDLE_METHODS)."""
    parent = parents.get(node)
    if isinstance(parent, ast.Subscript):
        return parent.slice is node
    if isinstance(parent, ast.Call) and parent.args and parent.args[0] is node:
        func = parent.func
        return isinstance(func, ast.Attribute) and func.attr in HANDLE_METHODS
    return False


def _is_docstring(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    expr = parents.get(node)
    owner = parents.get(expr) if isinstance(expr, ast.Expr) else None
    body = getattr(owner, "body", None)
    return bool(body) and body[0] is expr  # type: ignore[index]


def violations(source: str, path: Path, tables: frozenset[str]) -> list[str]:
    """Where ``source`` (the module at ``path``) depends on SQLite: ``file:line: what``."""
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    tree = ast.parse(source, str(path))
    package = _package_of(path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: list[str] = []

    def report(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{getattr(node, 'lineno', '?')}: {what}")

    modules = _store_modules()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in DRIVERS:
                    report(node, f"imports the driver {alias.name}")
                elif _in_store(alias.name) and alias.name != "echo_bot.store":
                    report(node, f"imports the store module {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, package)
            if module.split(".")[0] in DRIVERS:
                report(node, f"imports from the driver {module}")
            elif _in_store(module):
                for alias in node.names:
                    if not _store_name_allowed(module, alias.name):
                        report(node, f"imports {alias.name} from {module}")
        elif isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_ATTRIBUTES:
                report(node, f"reaches the store's .{node.attr}")
            elif node.attr in modules and _names_the_store_package(node.value):
                report(node, f"reaches the store module .{node.attr}")
        elif isinstance(node, ast.Call):
            func = node.func
            # db.execute("…"), db.query(f"…"): a string handed to a database handle.
            if (
                isinstance(func, ast.Attribute)
                and func.attr in HANDLE_METHODS
                and node.args
                and _holds_text(node.args[0])
                and not (  # a table's name alone: reported as such below
                    isinstance(node.args[0], ast.Constant) and node.args[0].value in tables
                )
            ):
                report(node, f"hands a string to .{func.attr}()")
            # getattr(db, "execute"), getattr(tx.inbox, "_db"): the same, spelt out.
            if isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2:
                name = _folded(node.args[1])
                if name in HANDLE_METHODS or name in PRIVATE_ATTRIBUTES:
                    report(node, f"reaches {name!r} by getattr")
        elif isinstance(node, ast.BinOp) and not isinstance(parents.get(node), ast.BinOp):
            text = _folded(node)  # the whole sum of literals, once
            if text is not None and _is_sql(text, tables):
                report(node, f"holds SQL: {text[:60]!r}")
        elif isinstance(node, ast.JoinedStr):  # an f-string: its text around the fields
            text = _folded(node) or ""
            if not isinstance(parents.get(node), ast.BinOp) and _is_sql(text, tables):
                report(node, f"holds SQL: {text[:60]!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            parent = parents.get(node)
            if _is_docstring(node, parents) or isinstance(parent, ast.JoinedStr | ast.BinOp):
                continue
            if _is_sql(node.value, tables):
                report(node, f"holds SQL: {node.value[:60]!r}")
            elif node.value in tables and _names_a_table_to_a_handle(node, parents):
                report(node, f"names the table {node.value!r}")
    return found


def checked_modules() -> list[Path]:
    return sorted(
        path
        for folder in CHECKED
        for path in folder.rglob("*.py")
        if not path.is_relative_to(STORE)
    )


def test_nothing_outside_the_store_depends_on_sqlite() -> None:
    tables = store_tables()
    found = [
        line for path in checked_modules() for line in violations(path.read_text(), path, tables)
    ]
    assert found == [], "\n".join(found)


def test_the_tables_are_read_from_the_schema() -> None:
    tables = store_tables()
    assert {"inbox", "outbox", "approvals", "reminders", "audit", "meta"} <= tables
    assert "sqlite_master" not in tables


# -- the checker itself catches each kind (so the test above cannot pass vacuously) ----
EXAMPLE = ROOT / "echo_bot" / "example.py"


def check(source: str) -> list[str]:
    return violations(source, EXAMPLE, store_tables())


@pytest.mark.parametrize(
    ("source", "what"),
    [
        ("import sqlite3\n", "imports the driver sqlite3"),
        ("import sqlite_utils.db\n", "imports the driver sqlite_utils.db"),
        ("from sqlite_utils import Database\n", "imports from the driver sqlite_utils"),
        ("from sqlite3 import connect\n", "imports from the driver sqlite3"),
        ("x = 'SELECT id FROM somewhere WHERE a = ?'\n", "holds SQL"),
        ("x = 'INSERT INTO t (a) VALUES (?)'\n", "holds SQL"),
        ("x = 'INSERT OR IGNORE INTO t (a) VALUES (?)'\n", "holds SQL"),
        ("x = 'UPDATE t SET a = ?'\n", "holds SQL"),
        ("x = 'DELETE FROM t'\n", "holds SQL"),
        ("x = 'CREATE TABLE t (a)'\n", "holds SQL"),
        ("x = 'PRAGMA quick_check'\n", "holds SQL"),
        ("x = 'BEGIN IMMEDIATE'\n", "holds SQL"),
        ("x = 'COMMIT'\n", "holds SQL"),
        ("x = f'SELECT {1} FROM t'\n", "holds SQL"),
        ("def f(db):\n    return db['reminders'].count\n", "names the table 'reminders'"),
        ("def f(db):\n    return db.table('outbox').count\n", "names the table 'outbox'"),
        ("def f(db):\n    db.create_table('tool_calls', {})\n", "names the table 'tool_calls'"),
        ("from .store.reminders import active_reminders\n", "imports active_reminders from"),
        ("from echo_bot.store.meta import queue_counts\n", "imports queue_counts from"),
        ("from .store.db import backup_to\n", "imports backup_to from echo_bot.store.db"),
        ("from .store.audit import AuditWriter\n", "imports AuditWriter from"),
        ("from .store import reminders\n", "imports reminders from echo_bot.store"),
        ("import echo_bot.store.inbox\n", "imports the store module echo_bot.store.inbox"),
        ("x = 'delete from inbox where 1'\n", "holds SQL"),
        ("x = 'select * from outbox'\n", "holds SQL"),
        ("x = 'SELECT * ' + 'FROM t'\n", "holds SQL"),
        ("x = 'select * ' + 'from ' + 'audit'\n", "holds SQL"),
        ("from . import store\nstore.inbox.add_inbound(db, m)\n", "reaches the store module"),
        (
            "import echo_bot.store\necho_bot.store.outbox.enqueue_outbound(db, m)\n",
            "reaches the store module .outbox",
        ),
        ("from .store.inbox import _row\n", "imports _row from echo_bot.store.inbox"),
        ("def f(tx):\n    return tx.inbox._db\n", "reaches the store's ._db"),
        ("def f(s):\n    return s.database\n", "reaches the store's .database"),
        ("def f(db):\n    db.execute(q + 'x')\n", "hands a string to .execute()"),
        ("def f(db):\n    return getattr(db, 'table')\n", "reaches 'table' by getattr"),
    ],
)
def test_the_checker_catches(source: str, what: str) -> None:
    found = check(source)
    assert len(found) == 1 and what in found[0], found
    assert found[0].startswith("echo_bot/example.py:")


def test_the_checker_names_the_line() -> None:
    assert check("'''A module.'''\n\nimport os\nimport sqlite3\n") == [
        "echo_bot/example.py:4: imports the driver sqlite3"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "from .store import DB_FILENAME, Store, Tx, backup_to\n",
        "from .store.reminders import ReminderRow\n",
        "from .store.approvals import ApprovalRow\n",
        "from .store.turns import CallRow\n",
        "from . import store\n",
        "def f():\n    '''SELECT a FROM t: a docstring may say so.'''\n",
        "x = 'Select one from the list, then update it and set a name.'\n",
        "x = 'the approvals command'\n",
        "x = {'approvals': 1, 'messages': []}\n",
        "parser.add_parser('audit')\n",
        "if command == 'reminders':\n    pass\n",
        "x = row['status']\n",
        "x = 'a message from the approvals command'\n",
        "def f(tx):\n    return tx.inbox.add(m)\n",
        "async def f(self):\n    return await self.registry.execute(call, ctx)\n",
        "x = 'reading the inbox failed; ' + 'retrying'\n",
    ],
)
def test_the_checker_lets_pass(source: str) -> None:
    assert check(source) == []
