"""The benchmark scripts still run: each one with --quick, as a subprocess.

No timing is asserted here (the machines are shared and noisy; the figures live in
bench/RESULTS.md): only that a script exits 0 and prints its Markdown table.

They run one after another on one xdist worker (``xdist_group("bench")``, with the short
soak and the HTTP flood's script): each script loads the machine by itself (a burst, a
flood, several daemons) for up to minutes, and two at once on two cores would starve each
other and the rest of the suite. They are ``slow``: the inner loop leaves them out.
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from tests.conftest import ROOT, echo_bot_env
from tests.postgres import reachable_admin_url

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bench")]


def run_quick(script: str, *extra: str, timeout: float = 240) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--quick", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=echo_bot_env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, f"{script} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result.stdout


def assert_markdown_table(output: str, first_column: str) -> None:
    lines = output.splitlines()
    header = [i for i, line in enumerate(lines) if line.startswith(f"| {first_column} |")]
    assert header, f"no table headed {first_column!r} in:\n{output}"
    at = header[0]
    assert lines[at + 1].startswith("| --- |"), lines[at + 1]
    rows = list(itertools.takewhile(lambda line: line.startswith("| "), lines[at + 2 :]))
    assert rows, output
    columns = lines[at].count("|")
    assert all(row.count("|") == columns for row in rows), output


@pytest.mark.timeout(300)
def test_outgoing_text_quick() -> None:
    output = run_quick("outgoing_text.py")
    assert_markdown_table(output, "case")
    assert "| slack long |" in output and "| matrix short |" in output


@pytest.mark.timeout(300)
def test_webhook_ingest_quick() -> None:
    output = run_quick("webhook_ingest.py")
    assert_markdown_table(output, "case")
    assert "b/a" in output


@pytest.mark.timeout(300)
def test_webhook_ingest_quick_on_postgres() -> None:
    admin = reachable_admin_url()
    output = run_quick(
        "webhook_ingest.py", "--engine", "postgres", "--database-url", admin, "--generator",
        "python",
    )  # fmt: skip
    assert_markdown_table(output, "case")
    assert "(PostgreSQL)" in output and "a bug" not in output


@pytest.mark.timeout(300)
def test_turns_quick() -> None:
    output = run_quick("turns.py", "--reference")
    assert_markdown_table(output, "sessions")
    assert "asyncio.Queue" in output
    assert "store floor: the same statements, bare sqlite3" in output


@pytest.mark.timeout(300)
def test_turns_quick_on_postgres() -> None:
    admin = reachable_admin_url()
    output = run_quick("turns.py", "--engine", "postgres", "--database-url", admin, "--reference")
    assert_markdown_table(output, "sessions")
    assert "store: postgres" in output
    assert ", 0 replies sent" not in output
    assert "store floor: the same statements, bare psycopg" in output


@pytest.mark.timeout(300)
def test_scaleout_quick() -> None:
    admin = reachable_admin_url()
    output = run_quick("scaleout.py", "--database-url", admin)
    assert_markdown_table(output, "instances")
    assert "throughput ÷ 1 instance: 1: 1.00, 2:" in output


@pytest.mark.timeout(300)
def test_cluster_soak_quick() -> None:
    """Two daemons on one database, three SIGKILLs: the script's own checks must pass
    (it exits 1 otherwise, and run_quick fails on that)."""
    admin = reachable_admin_url()
    output = run_quick("cluster_soak.py", "--database-url", admin)
    assert_markdown_table(output, "check")
    assert "\nOK in " in output


def test_pg_driver_runs() -> None:
    admin = reachable_admin_url()
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pg_driver.py"), "--statements", "200",
         "--database-url", admin],
        capture_output=True, text=True, timeout=120, env=echo_bot_env(), cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert_markdown_table(result.stdout, "driver")
    assert "psycopg 3, sync (the store's)" in result.stdout


@pytest.mark.timeout(300)
def test_telegram_burst_quick() -> None:
    output = run_quick("telegram_burst.py")
    assert_markdown_table(output, "case")
    rows = [line.split("|") for line in output.splitlines() if line.startswith("| one chat")]
    assert rows, output


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("script", "cases"),
    [
        ("slack_burst.py", ("| one DM", "| over")),
        ("discord_burst.py", ("| one DM", "| over")),
        ("email_burst.py", ("| one person", "| 4 ")),
    ],
)
def test_channel_burst_quick(script: str, cases: tuple[str, str]) -> None:
    output = run_quick(script)
    assert_markdown_table(output, "case")
    rows = [line for line in output.splitlines() if line.startswith(cases)]
    assert len(rows) == 2, output
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[1] == cells[5] and cells[6] == cells[7] == cells[11] == "0", row


@pytest.mark.timeout(300)
def test_footprint_quick() -> None:
    output = run_quick("footprint.py")
    assert_markdown_table(output, "configuration")
    assert "(a) imports aiogram" in output


@pytest.mark.timeout(300)
def test_fairness_quick() -> None:
    output = run_quick("fairness.py")
    assert_markdown_table(output, "case")
    assert "| one chat |" in output and "| burst then /tools |" in output


def test_stream_previews_quick() -> None:
    output = run_quick("stream_previews.py")
    assert_markdown_table(output, "case")


@pytest.mark.timeout(300)
def test_console_quick() -> None:
    output = run_quick("console.py")
    assert_markdown_table(output, "case")
    assert "live queue p50" in output


@pytest.mark.timeout(300)
def test_matrix_burst_quick(synapse: object) -> None:
    """Against a Synapse of its own; the session's ``synapse`` fixture only says whether
    one can start here (skipped, or failed under CI, when not)."""
    import os

    from tests.matrix_server import PYTHON_ENV

    extra = {PYTHON_ENV: os.environ[PYTHON_ENV]} if PYTHON_ENV in os.environ else {}
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "matrix_burst.py"), "--quick"],
        capture_output=True, text=True, timeout=280, env=echo_bot_env(**extra), cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, f"exited {result.returncode}:\n{result.stderr[-4000:]}"
    row = next(line for line in result.stdout.splitlines() if line.startswith("| encrypted"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1] == cells[5] == "12" and cells[6] == cells[7] == cells[9] == "0", row
