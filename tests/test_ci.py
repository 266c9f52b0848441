"""CI runs the README's test command, and says what each of its phases cost.

CI runs ``.ci/run``; the README promises that its test command is what CI runs. Both
are text a person edits, so they drift unless a test reads them side by side.
"""

from __future__ import annotations

import re
import subprocess
import tomllib

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
CI_RUN = (ROOT / ".ci" / "run").read_text()
INSTALL = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[test]' && "


def readme_test_command() -> str:
    """The pytest part of the README's second set-up command."""
    lines = [line for line in README.splitlines() if line.startswith(INSTALL)]
    assert len(lines) == 1, f"one README line starts {INSTALL!r}: {lines}"
    return lines[0].removeprefix(INSTALL)


def test_ci_runs_the_readmes_test_command() -> None:
    command = readme_test_command()
    assert command.startswith("pytest"), command
    ran = re.findall(r"^phase pytest (.+)$", CI_RUN, re.M)
    assert ran == [command], f".ci/run runs {ran}, the README says {command!r}"
    assert "pip install -q -e '.[test]'" in CI_RUN


def test_the_test_command_runs_in_parallel_in_a_random_order_with_its_costs_shown() -> None:
    """Parallel by the README's ``-n``; the order shuffled (pytest-randomly, with the
    test extra) and the 25 slowest tests listed, by pyproject's addopts."""
    assert re.search(r"(^| )-n [1-9]", readme_test_command())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = " ".join(project["project"]["optional-dependencies"]["test"])
    assert "pytest-xdist" in extra and "pytest-randomly" in extra
    addopts = project["tool"]["pytest"]["ini_options"]["addopts"]
    assert "--durations=25" in addopts and "--dist loadgroup" in addopts
    assert "tests" in project["tool"]["mypy"]["files"]


def test_ci_run_is_valid_bash_and_ends_with_its_phase_times() -> None:
    subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")], check=True)
    for name in ("system packages", "postgresql", "synapse", "pip", "ruff", "mypy", "pytest"):
        assert re.search(rf'^phase "?{name}"? ', CI_RUN, re.M), f"no phase {name!r}"
    assert 'echo "ci: $((SECONDS - START)) s (pytest $pytest_s s), exit $rc"' in CI_RUN
