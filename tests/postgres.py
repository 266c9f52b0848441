"""A real PostgreSQL server for the tests: a database per xdist worker, emptied before
each test that runs on both engines (``empty_database``), and a fresh one for a test
that needs a database of its own (``fresh_database``).

``ECHO_BOT_TEST_POSTGRES`` names a role that may create databases, as a URL
(``.ci/run`` starts the server and sets it; the default below is what the README's
set-up creates). Where the server cannot be reached or refuses that role (another
server on the port, a wrong password), the PostgreSQL tests fail under CI (``CI``
set) — never a silent skip there — and are skipped, saying why, everywhere else.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

ENV = "ECHO_BOT_TEST_POSTGRES"
DEFAULT_URL = "postgresql://echo_bot_test:echo_bot_test@127.0.0.1:5432/postgres"


def admin_url() -> str:
    return os.environ.get(ENV) or DEFAULT_URL


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _unreachable(reason: str, exc: BaseException | None = None) -> None:
    import pytest  # here: bench/ scripts use this module without pytest

    refused = getattr(exc, "sqlstate", None) in ("28P01", "28000") or (
        "authentication failed" in reason
    )
    if refused:  # it answered: the user or password in the URL is wrong
        message = (
            f"PostgreSQL at {ENV} refused the login (check the URL's user and password): {reason}"
        )
    else:
        message = f"PostgreSQL at {ENV} is not reachable: {reason}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message + " (start it as the README's Development section says)")


def reachable_admin_url() -> str:
    """The test server's admin URL once it answers (else fail or skip, as above)."""
    try:
        import psycopg
    except ImportError as exc:
        _unreachable(f"psycopg is not installed ({exc})")
        raise
    try:
        with psycopg.connect(admin_url(), connect_timeout=5):
            pass
    except psycopg.Error as exc:
        _unreachable(" ".join(str(exc).split()), exc)
    return admin_url()


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new, empty database on the test server; its URL. Dropped afterwards."""
    try:
        import psycopg
    except ImportError as exc:  # the test extra brings it
        _unreachable(f"psycopg is not installed ({exc})")
        raise
    admin = admin_url()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")  # whose it is, if one is left
    name = f"echo_bot_test_{worker}_{secrets.token_hex(6)}"
    try:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        _unreachable(" ".join(str(exc).split()), exc)
    try:
        yield with_database(admin, name)
    finally:
        drop_database(admin, name)


def empty_database(url: str) -> None:
    """The database at ``url`` as a new one is, for the next test: every other session
    of our role on it ended (a daemon a test killed keeps its sessions, and their locks,
    until the server notices), then its ``public`` schema dropped with all it holds and
    made again, so the store migrates it afresh.

    Cheaper than a new database per test, which is what the tests on both engines did:
    CREATE and DROP DATABASE each cost the server a checkpoint and a copy of the
    template, ~0.2 s of CPU against ~0.13 s for this and the migration, measured on two
    cores (and a checkpoint stalls every other worker's commits while it writes)."""
    import psycopg

    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND usename = current_user"
            " AND pid <> pg_backend_pid()"
        )
        conn.execute("DROP SCHEMA IF EXISTS public CASCADE")
        conn.execute("CREATE SCHEMA public")


def drop_database(admin: str, name: str, *, patience: float = 60.0) -> None:
    """DROP DATABASE … WITH (FORCE), again while an autovacuum worker is on it (it runs
    as the server's superuser, which our role may not terminate: the drop fails with
    InsufficientPrivilege until the worker is done)."""
    import time

    import psycopg

    deadline = time.monotonic() + patience
    while True:
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            try:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                return
            except psycopg.errors.InsufficientPrivilege:
                if time.monotonic() > deadline:
                    raise
        time.sleep(0.5)
