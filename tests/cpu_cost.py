"""``--cpu-durations=N``: the N tests that cost the most CPU, beside ``--durations``.

``--durations`` shows wall time, which on a loaded machine is mostly waiting; what makes
the parallel suite slow on two cores is CPU, and most of it is spent in the processes a
test starts (an ``echo-bot`` command imports pydantic and, with Telegram on, aiogram's
~900 models: 2 s of a core). So each test's CPU is measured from its setup to its
teardown: its worker's own (every thread) and that of the child processes the worker
waited for in that time. A child reaped later (a session's Synapse) counts where it is
reaped. The figures are what the ``slow`` mark is chosen by: a test that costs seconds
of a core belongs to the full run, not the inner loop.

Works with xdist: each worker attaches its tests' figures to their teardown reports
(``user_properties``), and the controller lists them.
"""

from __future__ import annotations

import resource

import pytest

KEY = "cpu_seconds"
_START = pytest.StashKey[float]()
_costs: list[tuple[float, str]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("terminal reporting").addoption(
        "--cpu-durations",
        type=int,
        default=0,
        metavar="N",
        help="list the N tests that cost the most CPU (theirs and their child processes')",
    )


def _cpu_now() -> float:
    mine = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.config.getoption("cpu_durations") > 0:  # measured only when asked for
        item.stash[_START] = _cpu_now()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if call.when == "teardown" and _START in item.stash:
        item.user_properties.append((KEY, round(_cpu_now() - item.stash[_START], 3)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "teardown":
        return
    for name, value in report.user_properties:
        if name == KEY and isinstance(value, int | float):
            _costs.append((float(value), report.nodeid))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    count = int(config.getoption("cpu_durations"))
    if count <= 0 or not _costs:
        return
    total = sum(cost for cost, _ in _costs)
    terminalreporter.write_sep("=", f"most CPU: {count} tests of {len(_costs)} ({total:.0f} s)")
    for cost, nodeid in sorted(_costs, reverse=True)[:count]:
        terminalreporter.write_line(f"{cost:7.2f}s {nodeid}")
