"""Who is asked: one table, first match wins (``PRECEDENCE``).

The table is the rule. The code walks it in order, docs/SECURITY.md and the approvals
section of config.example.toml show it as ``precedence_table()`` renders it (a test
keeps them equal), and the test of every combination derives its expectations from it.

The rows speak of what a call *does* — its risk, the chat it sends to, the owner's data
it hands out (``Tool.effect``) — never of a tool by name, so a new tool that sends or
discloses is asked for the way the built-ins are. The owner's config (``require``,
``never``) comes before any tool's own rule; a call that asks because of what it does
(dangerous, leaving the chat, disclosing) is never waived by a grant, and "Allow here
for a time" is offered only on a call that the last row asks for. A grant is looked up
(a store read) only for a call that would otherwise ask: its row comes after every
other row that lets a call run.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from ..config import ApprovalsConfig
from ..errors import ConfigError
from ..tools.base import Effect, Risk, Tool, ToolContext
from ..tools.registry import ToolRegistry

# Whether a live grant for this tool, in this chat, covers a call of this scope.
GrantLookup = Callable[[str], bool]


class Answer(StrEnum):
    ASKS = "asks"
    RUNS = "runs"
    TOOLS = "as the tool's rule says"


@dataclass
class Call:
    """The facts of one call the rows are judged on, each worked out once, when a row
    first needs it (a grant is looked up only if the walk gets that far)."""

    tool: Tool
    args: dict[str, Any]
    ctx: ToolContext
    require: frozenset[str]
    never: frozenset[str]
    granted: GrantLookup

    @cached_property
    def risk(self) -> Risk:
        return self.tool.risk_for(self.args)

    @cached_property
    def override(self) -> bool | None:
        return self.tool.approval_override(self.args, self.ctx)

    @cached_property
    def effect(self) -> Effect:
        return self.tool.effect(self.args, self.ctx)

    @property
    def leaves(self) -> bool:
        sends_to = self.effect.sends_to
        return sends_to is not None and sends_to != self.ctx.origin

    @property
    def discloses_to_a_stranger(self) -> bool:
        """The owner's data goes to someone the gate does not trust with it: anyone but
        an approver in their own direct chat (in a group every member reads it), or the
        chat a route's or job's results go to (``deliver_to``, chosen by the owner in
        the config)."""
        effect, ctx = self.effect, self.ctx
        if not effect.discloses:
            return False
        answer_to = ctx.answer_to or ctx.origin
        if effect.sends_to is None and answer_to != ctx.origin:
            return False  # to the route's or job's deliver_to
        return not (ctx.approver and ctx.direct and effect.sends_to in (None, ctx.origin))

    def grant_covers(self) -> bool:
        if self.risk != Risk.WRITE or not self.ctx.approver:
            return False
        return self.granted(self.tool.grant_scope(self.args, self.ctx))


@dataclass(frozen=True, slots=True)
class Rule:
    key: str  # the row's name in tests and logs
    when: str  # the condition, for people (docs/SECURITY.md, config.example.toml)
    answer: Answer
    reason: str  # why a call was asked or not (audit, the prompt)
    matches: Callable[[Call], bool]
    # Whether a prompt this row asks for may offer "Allow here for a time" (only in the
    # requester's own chat, to an approver there).
    offers_grant: bool = False


PRECEDENCE: tuple[Rule, ...] = (
    Rule(
        "require",
        "the tool is listed in `[approvals] require`",
        Answer.ASKS,
        "listed in approvals.require",
        lambda c: c.tool.name in c.require,
    ),
    Rule(
        "allowlisted",
        "the call is dangerous and the tool's own exact rule admits it "
        "(`[tools.shell] allow_commands`), and it hands the owner's data (the command's "
        "output) to no one but an approver in their own direct chat or the owner's "
        "`deliver_to`",
        Answer.RUNS,
        "tool rule (allowlisted)",
        lambda c: (
            c.risk == Risk.DANGEROUS and c.override is False and not c.discloses_to_a_stranger
        ),
    ),
    Rule(
        "dangerous",
        "the call is dangerous (the tool, or this call of it: a write to a dot path)",
        Answer.ASKS,
        "dangerous call",
        lambda c: c.risk == Risk.DANGEROUS,
    ),
    Rule(
        "never",
        "the tool is listed in `[approvals] never`",
        Answer.RUNS,
        "listed in approvals.never",
        lambda c: c.tool.name in c.never,
    ),
    Rule(
        "leaves",
        "the call sends to a chat other than the requester's",
        Answer.ASKS,
        "sends to another chat",
        lambda c: c.leaves,
    ),
    Rule(
        "discloses",
        "the call hands the owner's data (a workspace file, a note, an MCP server's "
        "answer) to anyone but an approver in their own direct chat (not a group) or "
        "the owner's `deliver_to`",
        Answer.ASKS,
        "hands the owner's data to a chat not only of approvers",
        lambda c: c.discloses_to_a_stranger,
    ),
    Rule(
        "tool_rule",
        "the tool's own rule decides this call",
        Answer.TOOLS,
        "tool rule",
        lambda c: c.override is not None,
    ),
    Rule(
        "read",
        "the call is read risk",
        Answer.RUNS,
        "read-only",
        lambda c: c.risk == Risk.READ,
    ),
    Rule(
        "own_chat",
        "the tool's effect stays in the requester's chat (reminders; send_message and "
        "send_file without `to`)",
        Answer.RUNS,
        "effect stays in the requester's chat",
        lambda c: c.tool.default_approval == "origin_chat",
    ),
    Rule(
        "granted",
        "a live grant covers the tool and the arguments that decide its effect, in "
        "this chat, and the requester approves here",
        Answer.RUNS,
        "allowed for a time in this chat",
        Call.grant_covers,
    ),
    Rule(
        "write",
        'anything else: a write (the only row whose prompt may offer "Allow here for a '
        "time\", in the requester's own chat, to an approver)",
        Answer.ASKS,
        "write risk",
        lambda c: True,
        offers_grant=True,
    ),
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the table says of one call: whether it asks, the row that decided, why."""

    asks: bool
    rule: Rule
    reason: str

    @property
    def offers_grant(self) -> bool:
        return self.asks and self.rule.offers_grant


def precedence_table() -> str:
    """The table as docs/SECURITY.md shows it (Markdown)."""
    lines = ["| # | when | the call |", "| --- | --- | --- |"]
    for number, rule in enumerate(PRECEDENCE, start=1):
        lines.append(f"| {number} | {rule.when} | {rule.answer} |")
    return "\n".join(lines)


def precedence_lines(width: int = 84) -> list[str]:
    """The table as config.example.toml's comment shows it, wrapped to ``width``."""
    lines: list[str] = []
    for number, rule in enumerate(PRECEDENCE, start=1):
        lines += textwrap.wrap(
            f"{number}. {rule.when}: {rule.answer}.",
            width,
            subsequent_indent=" " * (len(str(number)) + 2),
            break_on_hyphens=False,
        )
    return lines


class ApprovalPolicy:
    def __init__(self, config: ApprovalsConfig, registry: ToolRegistry, source: str) -> None:
        registry.check_names(config.require, "approvals.require", source)
        registry.check_names(config.never, "approvals.never", source)
        dangerous = [
            name
            for name in config.never
            if (tool := registry.get(name)) and tool.risk == Risk.DANGEROUS
        ]
        if dangerous:
            raise ConfigError(
                f"{source}: approvals.never: {', '.join(dangerous)} is dangerous and always "
                "asks; it cannot be listed in 'never'"
            )
        self._require = frozenset(config.require)
        self._never = frozenset(config.never)

    def judge(
        self,
        tool: Tool,
        args: dict[str, Any],
        ctx: ToolContext,
        granted: GrantLookup = lambda scope: False,
    ) -> Verdict:
        """Whether this call waits for consent, and the row of ``PRECEDENCE`` that says
        so. ``granted`` is asked only when the walk reaches the grant row."""
        call = Call(tool, args, ctx, self._require, self._never, granted)
        for rule in PRECEDENCE:
            if rule.matches(call):
                return _verdict(rule, call)
        raise AssertionError("the last row of PRECEDENCE matches every call")


def _verdict(rule: Rule, call: Call) -> Verdict:
    if rule.answer is Answer.TOOLS:
        asks = bool(call.override)
        return Verdict(asks, rule, rule.reason + ("" if asks else " (allowlisted)"))
    asks = rule.answer is Answer.ASKS
    reason = rule.reason
    if rule.key == "discloses":
        reason = f"hands {call.effect.discloses} to a chat not only of approvers"
    return Verdict(asks, rule, reason)
