"""Who is asked: the owner's config wins over a tool's own rule.

Every combination of ``[approvals] require`` / ``never`` / a live "allow for a time"
grant against read, write, origin-chat, dangerous (allowlisted or not) and per-call
dangerous calls, on the real ApprovalPolicy with the real built-in tools; then the
attack end to end: a real ``echo-bot chat`` process where ``require`` must beat the
shell allowlist.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from echo_bot.app import build_core
from echo_bot.approvals import ApprovalPolicy
from echo_bot.config import ApprovalsConfig, LoadedConfig, parse_config
from echo_bot.errors import ConfigError
from echo_bot.events import Address, Sender
from echo_bot.tools.base import Risk, Tool, ToolContext, ToolResult
from echo_bot.tools.registry import ToolRegistry
from tests.conftest import run_echo_bot

ORIGIN = Address(channel="telegram", chat_id="1")
CONTEXT = ToolContext(
    trace_id="t", session_key=str(ORIGIN), origin=ORIGIN, user=Sender(id="1", name="owner")
)

TOOLS = """
[tools]
profile = "full"
[tools.shell]
enabled = true
allow_commands = ["echo hi"]
[tools.http]
allow_domains = ["example.org"]
"""


class ConfigWriteTool(Tool):
    """A write tool whose writes under ``.git/`` are dangerous for that call only (the
    shape of file_write's rule for paths that programs read as configuration or hooks)."""

    name: ClassVar[str] = "config_write"
    description: ClassVar[str] = "Write a file."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    }
    risk: ClassVar[Risk] = Risk.WRITE

    def risk_for(self, args: dict[str, Any]) -> Risk:
        return Risk.DANGEROUS if str(args["path"]).startswith(".git/") else Risk.WRITE

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.success("written")


@dataclass(frozen=True)
class Case:
    tool: str
    args: dict[str, Any]
    # Whether the call asks, for each (require, never, grant) in the order of
    # itertools.product([False, True], repeat=3): "A" asks, "-" runs unasked,
    # "E" is a config error (a tool declared dangerous listed in ``never``).
    expected: str


CASES = {
    "read": Case("current_time", {}, "----AAAA"),
    "read-call-of-a-write-tool": Case("http_request", {"url": "https://example.org/"}, "----AAAA"),
    "write": Case("file_write", {"path": "a.txt", "content": "x"}, "A---AAAA"),
    "write-call-of-http": Case(
        "http_request", {"url": "https://example.org/", "method": "POST"}, "A---AAAA"
    ),
    "write-in-origin-chat": Case("send_message", {"text": "hi"}, "----AAAA"),
    "write-to-another-chat": Case("send_message", {"text": "hi", "to": "telegram:2"}, "A---AAAA"),
    "reminder-in-origin-chat": Case(
        "reminder_create", {"text": "call the bank", "when": "in 1 hour"}, "----AAAA"
    ),
    "dangerous-allowlisted": Case("shell_exec", {"command": "echo hi"}, "--EEAAEE"),
    "dangerous-not-allowlisted": Case("shell_exec", {"command": "echo ho"}, "AAEEAAEE"),
    "dangerous-call-of-a-write-tool": Case("config_write", {"path": ".git/config"}, "AAAAAAAA"),
    "write-call-of-that-tool": Case("config_write", {"path": "notes.txt"}, "A---AAAA"),
}
SETTINGS = list(itertools.product([False, True], repeat=3))


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> ToolRegistry:
    state_dir = tmp_path_factory.mktemp("state")
    config = parse_config(tomllib.loads(TOOLS), "test.toml")
    core = build_core(LoadedConfig(config=config, path=state_dir / "test.toml"), state_dir, {})
    core.registry.register(ConfigWriteTool())
    return core.registry


def _setting_id(setting: tuple[bool, bool, bool]) -> str:
    names = ("require", "never", "grant")
    return "+".join(n for n, on in zip(names, setting, strict=True) if on) or "plain"


@pytest.mark.parametrize(
    ("case", "require", "never", "grant"),
    [
        pytest.param(name, *setting, id=f"{name}-{_setting_id(setting)}")
        for name in CASES
        for setting in SETTINGS
    ],
)
def test_who_is_asked_every_combination(
    registry: ToolRegistry, case: str, require: bool, never: bool, grant: bool
) -> None:
    spec = CASES[case]
    want = spec.expected[SETTINGS.index((require, never, grant))]
    approvals = ApprovalsConfig(
        require=[spec.tool] if require else [], never=[spec.tool] if never else []
    )
    if want == "E":
        with pytest.raises(ConfigError, match=r"approvals\.never"):
            ApprovalPolicy(approvals, registry, "test.toml")
        return
    policy = ApprovalPolicy(approvals, registry, "test.toml")
    tool = registry.get(spec.tool)
    assert tool is not None
    asks, reason = policy.needs_approval(tool, spec.args, CONTEXT, granted=grant)
    assert asks is (want == "A"), reason
    if require:
        assert reason == "listed in approvals.require"


def test_attack_require_beats_the_shell_allowlist(registry: ToolRegistry) -> None:
    """Regression: with ``require = ["shell_exec"]`` an allowlisted command ran unasked."""
    policy = ApprovalPolicy(ApprovalsConfig(require=["shell_exec"]), registry, "test.toml")
    shell = registry.get("shell_exec")
    assert shell is not None
    assert policy.needs_approval(shell, {"command": "echo hi"}, CONTEXT, granted=False) == (
        True,
        "listed in approvals.require",
    )


def test_attack_never_and_grants_do_not_exempt_a_dangerous_call(registry: ToolRegistry) -> None:
    """A write tool in ``never`` with a live grant still asks for a call whose own risk
    is dangerous (a write under .git/ would plant a hook)."""
    policy = ApprovalPolicy(ApprovalsConfig(never=["config_write"]), registry, "test.toml")
    tool = registry.get("config_write")
    assert tool is not None
    assert policy.needs_approval(tool, {"path": ".git/config"}, CONTEXT, granted=True) == (
        True,
        "dangerous call",
    )
    assert policy.needs_approval(tool, {"path": "notes.txt"}, CONTEXT, granted=True)[0] is False


REQUIRE_SHELL = """
[tools]
profile = "coding"
[tools.shell]
enabled = true
allow_commands = ["echo hi"]
[approvals]
require = ["shell_exec"]
"""


def test_attack_allowlisted_command_waits_for_approval_when_required(tmp_path: Path) -> None:
    """Regression (end to end, a real ``echo-bot chat`` process): ``/run echo hi`` is on
    the allowlist, but ``[approvals] require`` names shell_exec, so it waits for the
    owner; denied it never runs, approved it runs once."""
    config = tmp_path / "config.toml"
    config.write_text(REQUIRE_SHELL)
    state = tmp_path / "st"
    result = run_echo_bot(
        "chat",
        "--config",
        str(config),
        "--state-dir",
        str(state),
        input="/run echo hi\nn\n/run echo hi\ny\n",
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count('Approve shell_exec(command="echo hi")? [y/N]') == 2, out
    assert "❌ Denied" in out and "APPROVAL_DENIED" in out
    assert "✅ Approved" in out
    assert out.count("exit code 0") == 1, out
