"""Who is asked: one table, first match wins (``approvals.policy.PRECEDENCE``).

Every combination of ``[approvals] require`` / ``never`` / a live "allow for a time"
grant against read, write, own-chat, another-chat, disclosing, dangerous (allowlisted or
not) and per-call dangerous calls, by an approver and by someone who is not, on the real
ApprovalPolicy with the real built-in tools. Each case states which rows' conditions hold
for its call; the row that must decide is the first of those in the table, so the test
follows the table and fails when the code walks it in another order. Then the attack end
to end: a real ``echo-bot chat`` process where ``require`` must beat the shell allowlist.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from echo_bot.approvals import ApprovalPolicy
from echo_bot.approvals.policy import PRECEDENCE, precedence_lines, precedence_table
from echo_bot.config import ApprovalsConfig, LoadedConfig, parse_config
from echo_bot.errors import ConfigError
from echo_bot.events import Address, Sender
from echo_bot.mcp.tool import make_tool
from echo_bot.runtime import build
from echo_bot.tools.base import Risk, Tool, ToolContext, ToolResult
from echo_bot.tools.registry import ToolRegistry
from tests.conftest import ROOT, run_echo_bot

ORIGIN = Address(channel="telegram", chat_id="1")


def context(
    *,
    approver: bool,
    user: str = "1",
    origin: Address = ORIGIN,
    answer_to: Address | None = None,
) -> ToolContext:
    """A call's context as the executor makes it (``answer_to`` is the origin unless a
    route or job delivers elsewhere; a chat whose id is the user's is their private
    chat)."""
    return ToolContext(
        trace_id="t",
        session_key=str(origin),
        origin=origin,
        user=Sender(id=user, name="someone"),
        approver=approver,
        direct=origin.chat_id == user,
        answer_to=answer_to or origin,
    )


OWNER = context(approver=True)
FRIEND = context(approver=False, user="7", origin=Address(channel="telegram", chat_id="7"))
GROUP = Address(channel="telegram", chat_id="-100123")
OWNER_IN_A_GROUP = context(approver=True, origin=GROUP)
HOOK = Address(channel="webhook", chat_id="deploy")
ROUTE = context(approver=False, user="hook", origin=HOOK, answer_to=HOOK)  # no deliver_to
ROUTED = context(approver=False, user="hook", origin=HOOK, answer_to=ORIGIN)  # deliver_to

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
    ctx: ToolContext
    # The rows of PRECEDENCE whose conditions hold for this call, beside require, never
    # and granted (which the settings give), and "write" for a call of write risk: the
    # first of them in the table decides.
    holds: frozenset[str]
    # Whether the call asks, for each (require, never, grant) in the order of
    # itertools.product([False, True], repeat=3): "A" asks, "-" runs unasked,
    # "E" is a config error (a tool declared dangerous listed in ``never``).
    expected: str


def case(tool: str, args: dict[str, Any], ctx: ToolContext, holds: str, expected: str) -> Case:
    return Case(tool, args, ctx, frozenset(holds.split()), expected)


NOTES = "inbox/telegram-42/2026-12-03/abcd1234-1-notes.txt"  # the owner's upload
OWN = "inbox/telegram-7/2026-12-03/abcd1234-1-photo.jpg"  # the friend's own upload
CASES = {
    "read": case("current_time", {}, OWNER, "read", "----AAAA"),
    "read-call-of-a-write-tool": case(
        "http_request", {"url": "https://example.org/"}, OWNER, "read", "----AAAA"
    ),
    "write": case("file_write", {"path": "a.txt", "content": "x"}, OWNER, "write", "A---AAAA"),
    "write-call-of-http": case(
        "http_request",
        {"url": "https://example.org/", "method": "POST"},
        OWNER,
        "write",
        "A---AAAA",
    ),
    "write-in-origin-chat": case(
        "send_message", {"text": "hi"}, OWNER, "own_chat write", "----AAAA"
    ),
    "write-to-another-chat": case(
        "send_message",
        {"text": "hi", "to": "telegram:2"},
        OWNER,
        "leaves own_chat write",
        "AA--AAAA",
    ),
    "reminder-in-origin-chat": case(
        "reminder_create",
        {"text": "call the bank", "when": "in 1 hour"},
        OWNER,
        "own_chat write",
        "----AAAA",
    ),
    "dangerous-allowlisted": case(
        "shell_exec", {"command": "echo hi"}, OWNER, "allowlisted dangerous tool_rule", "--EEAAEE"
    ),
    # An allowlisted command's output is the owner's (it runs in the workspace): run
    # unasked only where the owner's files may go (third adversarial round's tools review).
    "dangerous-allowlisted-for-a-non-approver": case(
        "shell_exec", {"command": "echo hi"}, FRIEND, "dangerous discloses tool_rule", "AAEEAAEE"
    ),
    "dangerous-allowlisted-in-a-group": case(
        "shell_exec",
        {"command": "echo hi"},
        OWNER_IN_A_GROUP,
        "dangerous discloses tool_rule",
        "AAEEAAEE",
    ),
    "dangerous-allowlisted-by-a-webhook-answered-to-the-owners-deliver_to": case(
        "shell_exec", {"command": "echo hi"}, ROUTED, "allowlisted dangerous tool_rule", "--EEAAEE"
    ),
    "dangerous-not-allowlisted": case(
        "shell_exec", {"command": "echo ho"}, OWNER, "dangerous", "AAEEAAEE"
    ),
    "dangerous-call-of-a-write-tool": case(
        "config_write", {"path": ".git/config"}, OWNER, "dangerous", "AAAAAAAA"
    ),
    "write-call-of-that-tool": case(
        "config_write", {"path": "notes.txt"}, OWNER, "write", "A---AAAA"
    ),
    # What a call does, whoever asks (findings 1 and 2 of the second adversarial round).
    "file-to-the-owners-own-chat": case(
        "send_file", {"path": "notes.txt"}, OWNER, "own_chat write", "----AAAA"
    ),
    "file-to-another-chat": case(
        "send_file",
        {"path": "notes.txt", "to": "telegram:2"},
        OWNER,
        "leaves own_chat write",
        "AA--AAAA",
    ),
    "owners-file-to-a-non-approver": case(
        "send_file", {"path": "notes.txt"}, FRIEND, "discloses own_chat write", "AA--AAAA"
    ),
    "owners-upload-to-a-non-approver": case(
        "send_file", {"path": NOTES}, FRIEND, "discloses own_chat write", "AA--AAAA"
    ),
    "a-non-approvers-own-upload-back": case(
        "send_file", {"path": OWN}, FRIEND, "own_chat write", "----AAAA"
    ),
    "owners-file-read-for-a-non-approver": case(
        "file_read", {"path": "notes.txt"}, FRIEND, "discloses read", "AA--AAAA"
    ),
    "owners-file-read-for-the-owner": case(
        "file_read", {"path": "notes.txt"}, OWNER, "read", "----AAAA"
    ),
    "mcp-read-for-a-non-approver": case("notes__read", {}, FRIEND, "discloses read", "AA--AAAA"),
    "mcp-read-for-the-owner": case("notes__read", {}, OWNER, "read", "----AAAA"),
    "write-of-a-non-approver": case(
        "file_write", {"path": "a.txt", "content": "x"}, FRIEND, "write", "AA--AAAA"
    ),
    "message-of-a-non-approver-to-their-chat": case(
        "send_message", {"text": "hi"}, FRIEND, "own_chat write", "----AAAA"
    ),
    "file-read-by-a-webhook-answered-to-the-owners-deliver_to": case(
        "file_read", {"path": "notes.txt"}, ROUTED, "read", "----AAAA"
    ),
    "file-read-by-a-webhook-with-no-deliver_to": case(
        "file_read", {"path": "notes.txt"}, ROUTE, "discloses read", "AA--AAAA"
    ),
    "owners-file-to-a-group-the-owner-asks-in": case(
        "send_file",
        {"path": "notes.txt"},
        OWNER_IN_A_GROUP,
        "discloses own_chat write",
        "AA--AAAA",
    ),
    "owners-file-read-in-a-group": case(
        "file_read", {"path": "notes.txt"}, OWNER_IN_A_GROUP, "discloses read", "AA--AAAA"
    ),
    "message-of-the-owner-to-a-group": case(
        "send_message", {"text": "hi"}, OWNER_IN_A_GROUP, "own_chat write", "----AAAA"
    ),
    "reminder-of-a-non-approver": case(
        "reminder_create",
        {"text": "call the bank", "when": "in 1 hour"},
        FRIEND,
        "own_chat write",
        "----AAAA",
    ),
}
SETTINGS = list(itertools.product([False, True], repeat=3))


def deciding_row(spec: Case, require: bool, never: bool, grant: bool) -> str:
    """The row that must decide: the first in the table whose condition holds."""
    holds = set(spec.holds)
    holds |= {"require"} if require else set()
    holds |= {"never"} if never else set()
    # A grant is only ever honoured for an approver's call of write risk.
    if grant and spec.ctx.approver and "write" in spec.holds:
        holds.add("granted")
    holds.add("write")  # the last row matches every call
    return next(rule.key for rule in PRECEDENCE if rule.key in holds)


class NotesClient:
    async def __call__(self, name: str, args: dict[str, Any], timeout: float) -> Any:
        raise AssertionError("never run here")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> ToolRegistry:
    state_dir = tmp_path_factory.mktemp("state")
    config = parse_config(tomllib.loads(TOOLS), "test.toml")
    runtime = build(LoadedConfig(config=config, path=state_dir / "test.toml"), state_dir, {})
    runtime.registry.register(ConfigWriteTool())
    runtime.registry.register(
        make_tool(
            name="notes__read",
            server="notes",
            remote_name="read",
            description="Read the owner's notes.",
            parameters={"type": "object", "properties": {}},
            annotations={"readOnlyHint": True},
            risk=Risk.READ,
            risk_source="owner",
            timeout=5.0,
            call=NotesClient(),
        )
    )
    return runtime.registry


def _setting_id(setting: tuple[bool, ...]) -> str:
    names = ("require", "never", "grant")
    return "+".join(n for n, on in zip(names, setting, strict=True) if on) or "plain"


@pytest.mark.parametrize(
    ("case_name", "require", "never", "grant"),
    [
        pytest.param(name, *setting, id=f"{name}-{_setting_id(setting)}")
        for name in CASES
        for setting in SETTINGS
    ],
)
def test_who_is_asked_every_combination(
    registry: ToolRegistry, case_name: str, require: bool, never: bool, grant: bool
) -> None:
    spec = CASES[case_name]
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
    verdict = policy.judge(tool, spec.args, spec.ctx, granted=lambda scope: grant)
    assert verdict.asks is (want == "A"), verdict.reason
    assert verdict.rule.key == deciding_row(spec, require, never, grant), verdict.reason
    if require:
        assert verdict.reason == "listed in approvals.require"


def test_a_grant_is_asked_for_only_when_the_walk_reaches_its_row(registry: ToolRegistry) -> None:
    """A grant can only waive consent: no lookup (a store read) for a call that a row
    above it decides, and the lookup gets the call's scope."""
    policy = ApprovalPolicy(ApprovalsConfig(), registry, "test.toml")
    asked: list[str] = []

    def granted(scope: str) -> bool:
        asked.append(scope)
        return True

    send = registry.get("send_message")
    write = registry.get("file_write")
    assert send is not None and write is not None
    assert policy.judge(send, {"text": "x", "to": "telegram:2"}, OWNER, granted).asks
    assert policy.judge(send, {"text": "x"}, OWNER, granted).asks is False
    assert asked == []
    assert (
        policy.judge(write, {"path": "notes/a.txt", "content": "x"}, OWNER, granted).asks is False
    )
    assert asked == ["notes/"]


def test_the_docs_show_the_table_the_code_walks() -> None:
    """docs/SECURITY.md and config.example.toml show PRECEDENCE as the code has it."""
    security = (ROOT / "docs" / "SECURITY.md").read_text()
    assert precedence_table() in security
    example = (ROOT / "config.example.toml").read_text()
    assert "\n".join(f"#   {line}" for line in precedence_lines()) in example


def test_attack_require_beats_the_shell_allowlist(registry: ToolRegistry) -> None:
    """Regression: with ``require = ["shell_exec"]`` an allowlisted command ran unasked."""
    policy = ApprovalPolicy(ApprovalsConfig(require=["shell_exec"]), registry, "test.toml")
    shell = registry.get("shell_exec")
    assert shell is not None
    verdict = policy.judge(shell, {"command": "echo hi"}, OWNER)
    assert (verdict.asks, verdict.reason) == (True, "listed in approvals.require")


def test_attack_never_and_grants_do_not_exempt_a_dangerous_call(registry: ToolRegistry) -> None:
    """A write tool in ``never`` with a live grant still asks for a call whose own risk
    is dangerous (a write under .git/ would plant a hook)."""
    policy = ApprovalPolicy(ApprovalsConfig(never=["config_write"]), registry, "test.toml")
    tool = registry.get("config_write")
    assert tool is not None
    verdict = policy.judge(tool, {"path": ".git/config"}, OWNER, granted=lambda _: True)
    assert (verdict.asks, verdict.reason) == (True, "dangerous call")
    assert policy.judge(tool, {"path": "notes.txt"}, OWNER, granted=lambda _: True).asks is False


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
