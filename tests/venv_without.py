"""A Python whose site-packages holds every package of the one the tests run in but the
ones named: as after a plain `pip install .` that left an extra out (no file of those
packages anywhere, so the import fails as it would there)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from tests.conftest import ROOT


def python_without(root: Path, left_out: Iterable[str], module: str) -> Path:
    """A venv at ``root`` without the entries of site-packages named in ``left_out``
    (exact names or name prefixes); ``module`` is checked not to import there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = Path(sysconfig.get_paths()["purelib"])
    names = tuple(left_out)
    for entry in ours.iterdir():
        if entry.name in names or entry.name.startswith(tuple(f"{n}-" for n in names)):
            continue
        (Path(site) / entry.name).symlink_to(entry)
    probe = subprocess.run(
        [python, "-c", f"import echo_bot, aiohttp, pydantic; import {module}"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert f"No module named '{module}'" in probe.stderr, probe.stderr
    return python
