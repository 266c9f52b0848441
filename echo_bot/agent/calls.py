"""Tool calls of one step: checked, gated, run at most once, recorded.

A call moves planned → (waiting → approved | done) → started → done. Side-effecting
calls are marked "started" in their own commit before they run, and "done" with their
result in the next one; a call found "started" later was interrupted by a crash and is
reported OUTCOME_UNKNOWN, never re-run. Read-only calls are simply run again, so their
results may wait for the commit that closes the step (``StepProgress.unrecorded``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from .. import metrics
from ..approvals import ApprovalGate, Ask
from ..events import InboundMessage
from ..live import Live
from ..secrets import Masker
from ..statuses import ApprovalStatus, CallStatus
from ..store import Store, Tx
from ..store.turns import CallRow, TurnRow
from ..tools.base import ErrorCode, Risk, Tool, ToolContext, ToolResult
from ..tools.registry import ToolRegistry

T = TypeVar("T")

log = logging.getLogger(__name__)


def args_hash(name: str, args: dict[str, Any]) -> str:
    canonical = json.dumps([name, args], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# A call run: the call as done, its result, and whether that result is committed yet.
_Ran = tuple[CallRow, ToolResult, bool]


@dataclass(frozen=True, slots=True)
class StepProgress:
    """How far a step got: its calls as stored, and whether one waits for approval."""

    waiting: bool
    calls: list[CallRow]
    # Results of read-only calls, not yet stored: ``record`` them in the transaction that
    # closes the step (a crash before it just runs them again).
    unrecorded: list[tuple[CallRow, ToolResult]] = field(default_factory=list)


class CallExecutor:
    def __init__(
        self,
        *,
        store: Store,
        registry: ToolRegistry,
        gate: ApprovalGate,
        live: Live,
        masker: Masker,
        fence: Callable[[Tx, str], None] | None = None,
    ) -> None:
        self.store = store
        # With several daemons: raises LeaseLost unless this one still holds the session.
        self.fence = fence
        self.registry = registry
        self.gate = gate
        self.live = live  # the policy and the approvers, as the last reload left them
        self.masker = masker

    def context(self, inbound: InboundMessage, call: CallRow) -> ToolContext:
        directory = self.live.current.directory
        return ToolContext(
            trace_id=inbound.trace_id,
            session_key=inbound.session_key,
            origin=inbound.address,
            user=inbound.sender,
            idempotency_key=call.id,
            approval_id=call.approval_id,
            answer_to=inbound.answer_to,
            approver=directory.approves(inbound.address, inbound.sender.id),
            direct=directory.direct(inbound.address, inbound.sender.id, inbound.direct),
            turn_id=inbound.id,
        )

    def settle_step(
        self,
        tx: Tx,
        inbound: InboundMessage,
        turn: TurnRow,
        exposed: Sequence[Tool],
        calls: list[CallRow] | None = None,
    ) -> list[CallRow]:
        """Decide what each call of the step may do (inside the caller's transaction):
        checked, approved, waiting for an approval, or finished with an error. The
        step's calls as they are now (``calls``: as the caller just stored them)."""
        available = {tool.name: tool for tool in exposed}
        if calls is None:
            calls = tx.turns.calls_of_step(turn.id, turn.step)
        # Each call as settled: what it was stored as in this transaction, so the step is
        # not read back.
        siblings = list(calls)
        for index, call in enumerate(calls):
            siblings[index] = self._settle(tx, inbound, turn, call, available, siblings)
        return siblings

    async def run_step(
        self,
        inbound: InboundMessage,
        turn: TurnRow,
        exposed: Sequence[Tool],
        settled: list[CallRow] | None = None,
    ) -> StepProgress:
        """Advance every call of the turn's current step as far as it can go now.

        ``settled``: the step's calls as ``settle_step`` left them in a transaction that
        has committed (the one that stored the step); otherwise they are settled here."""
        available = {tool.name: tool for tool in exposed}
        if settled is None:
            calls = await self._write(
                inbound, lambda tx: self.settle_step(tx, inbound, turn, exposed)
            )
        else:
            calls = settled
        if any(c.status == CallStatus.WAITING for c in calls):
            # The step resumes when every pending request is decided (docs/ARCHITECTURE.md,
            # "The flow of one turn"); nothing of it runs before, so an approved call
            # never runs ahead of a denied one.
            return StepProgress(waiting=True, calls=calls)
        runnable = [c for c in calls if c.status == CallStatus.APPROVED]
        if not runnable:
            return StepProgress(waiting=False, calls=calls)
        pairs = [(available.get(c.name) or self.registry.get(c.name), c) for c in runnable]
        gone = [call for tool, call in pairs if tool is None]
        if gone:  # its MCP server is down or dropped it since: nothing is sent
            for call in gone:
                result = self.registry.not_found(call.name)
                await self._write(
                    inbound, partial(self._finish, inbound=inbound, call=call, result=result)
                )
            return await self.run_step(inbound, turn, exposed)
        finished = await self._run_all(inbound, [(t, c) for t, c in pairs if t is not None])
        # Only this turn's worker moves its calls, so these are their current states.
        done = {call.id: call for call, _result, _recorded in finished}
        return StepProgress(
            waiting=False,
            calls=[done.get(c.id, c) for c in calls],
            unrecorded=[(call, result) for call, result, recorded in finished if not recorded],
        )

    async def _run_all(
        self, inbound: InboundMessage, pairs: list[tuple[Tool, CallRow]]
    ) -> list[_Ran]:
        """A step of read-only calls runs them together; one with any write runs its
        calls one after the other, in order."""
        if all(tool.risk_for(call.args) == Risk.READ for tool, call in pairs):
            return list(await asyncio.gather(*(self._run(inbound, t, c) for t, c in pairs)))
        return [await self._run(inbound, t, c) for t, c in pairs]

    def record(
        self, tx: Tx, inbound: InboundMessage, results: list[tuple[CallRow, ToolResult]]
    ) -> None:
        """Store results ``run_step`` left unrecorded (inside the caller's transaction)."""
        for call, result in results:
            self._finish(tx, inbound, call, result)

    # -- deciding what a call may do (inside one transaction) ---------------------------
    def _settle(
        self,
        tx: Tx,
        inbound: InboundMessage,
        turn: TurnRow,
        call: CallRow,
        available: dict[str, Tool],
        siblings: list[CallRow],
    ) -> CallRow:
        """Settle ``call``; the call as it is stored now."""
        if call.status == CallStatus.PLANNED:
            return self._plan(tx, inbound, turn, call, available, siblings)
        if call.status == CallStatus.WAITING:
            return self._check_approval(tx, inbound, call)
        if call.status == CallStatus.STARTED:
            # Only a call with side effects is marked started (whatever its tool's risk
            # says now: an MCP server's annotations may change): never run again.
            result = ToolResult.failure(
                ErrorCode.OUTCOME_UNKNOWN,
                f"{call.name} was running when echo-bot stopped; it may or may not have "
                "taken effect, so it was not run again. Check before retrying.",
            )
            return self._finish_settled(tx, inbound, call, result)
        return call

    def _plan(
        self,
        tx: Tx,
        inbound: InboundMessage,
        turn: TurnRow,
        call: CallRow,
        available: dict[str, Tool],
        siblings: list[CallRow],
    ) -> CallRow:
        if call.error is not None:
            result = ToolResult.failure(ErrorCode.INVALID_PARAMETER, call.error)
            return self._finish_settled(tx, inbound, call, result)
        tool = available.get(call.name)
        if tool is None:
            return self._finish_settled(tx, inbound, call, self._unavailable(call.name, available))
        invalid = self.registry.validate(call.name, call.args)
        if invalid is not None:
            return self._finish_settled(tx, inbound, call, invalid)
        ctx = self.context(inbound, call)
        settings = self.live.current  # one policy and one set of approvers for the call
        verdict = settings.policy.judge(
            tool,
            call.args,
            ctx,
            granted=lambda scope: self.gate.granted(tx, inbound.address, tool.name, scope),
        )
        if not verdict.asks:
            return _set(tx, call, CallStatus.APPROVED)
        # One prompt for identical calls in the same step.
        twin = next(
            (
                s
                for s in siblings
                if s.args_hash == call.args_hash and s.approval_id and s.id != call.id
            ),
            None,
        )
        if twin is not None:
            return _set(tx, call, CallStatus.WAITING, approval_id=twin.approval_id)
        # No chat to prompt: it waits for `echo-bot approvals` (routing.OWNER_QUEUE).
        prompt_to = settings.directory.route(
            tx, inbound.address, inbound.sender.id, inbound.deliver_to
        )
        # "Allow here for a time" only where its grant would be honoured: a write asked
        # in the requester's own chat, of an approver there.
        offer = verdict.offers_grant and ctx.approver and prompt_to == inbound.address
        approval_id = self.gate.request(
            tx,
            Ask(
                turn_id=turn.id,
                session_key=inbound.session_key,
                trace_id=inbound.trace_id,
                tool=tool.name,
                args=call.args,
                args_hash=call.args_hash,
                risk=tool.risk_for(call.args),
                reason=verdict.reason,
                requester=inbound.sender,
                origin=inbound.address,
                prompt_to=prompt_to,
                key_args=tool.key_args,
                grant_scope=tool.grant_scope(call.args, ctx) if offer else None,
            ),
        )
        # Later identical siblings in this step reuse it (they see the new approval_id:
        # settle_step puts this row in their list).
        return _set(tx, call, CallStatus.WAITING, approval_id=approval_id)

    def _unavailable(self, name: str, available: dict[str, Tool]) -> ToolResult:
        known = self.registry.get(name)
        if known is None:
            return self.registry.not_found(name, available)
        if not known.available():
            why = "it is switched off in the config"
            if name == "shell_exec":
                why += " ([tools.shell] enabled = true switches it on)"
        else:
            why = "the tools profile does not include it (add it to [tools] allow)"
        return ToolResult.failure(ErrorCode.PERMISSION_DENIED, f"{name} is not available: {why}.")

    def _check_approval(self, tx: Tx, inbound: InboundMessage, call: CallRow) -> CallRow:
        row = tx.approvals.get(call.approval_id or "")
        if row is None or row.status == ApprovalStatus.PENDING:
            return call
        if row.args_hash != call.args_hash:  # a decision binds to the exact call
            result = ToolResult.failure(ErrorCode.APPROVAL_DENIED, "approval does not match call")
            return self._finish_settled(tx, inbound, call, result)
        if row.status == ApprovalStatus.APPROVED:
            return _set(tx, call, CallStatus.APPROVED)
        if row.status == ApprovalStatus.DENIED:
            result = ToolResult.failure(
                ErrorCode.APPROVAL_DENIED, f"{call.name} was denied by the approver."
            )
            return self._finish_settled(tx, inbound, call, result)
        result = ToolResult.failure(
            ErrorCode.APPROVAL_EXPIRED,
            f"The approval request for {call.name} expired before anyone decided.",
        )
        return self._finish_settled(tx, inbound, call, result)

    def _finish_settled(
        self, tx: Tx, inbound: InboundMessage, call: CallRow, result: ToolResult
    ) -> CallRow:
        """``_finish`` while settling: the call as stored (its result as read back)."""
        stored = self._finish(tx, inbound, call, result)
        return replace(call, status=CallStatus.DONE, result=json.loads(json.dumps(stored)))

    def _finish(
        self, tx: Tx, inbound: InboundMessage, call: CallRow, result: ToolResult
    ) -> dict[str, Any]:
        stored = result.to_json()
        tx.turns.set_call(call.id, CallStatus.DONE, result=stored)
        outcome = "ok" if result.ok else str(result.error_code or "failed")
        tx.on_commit(lambda: metrics.TOOL_CALLS.labels(call.name, outcome).inc())
        tx.audit.write(
            "tool.result",
            trace_id=inbound.trace_id,
            session_key=inbound.session_key,
            call_id=call.id,
            approval_id=call.approval_id,  # the request it ran on (the console's outcome)
            tool=call.name,
            args=call.args,
            ok=result.ok,
            error_code=result.error_code,
            output=result.output[:4000],
            latency_ms=round(result.latency_ms, 3),
        )
        return stored

    async def _write(self, inbound: InboundMessage, write: Callable[[Tx], T]) -> T:
        return await run_fenced(self.store, self.fence, inbound.session_key, write)

    # -- running ---------------------------------------------------------------------
    async def _run(self, inbound: InboundMessage, tool: Tool, call: CallRow) -> _Ran:
        """Run one approved call: the call as done, its result, and whether that is
        committed yet (always for side effects and approved calls; other read-only
        results wait, see the module doc)."""
        ctx = self.context(inbound, call)
        changed = self._changed_since_checked(tool, call, ctx)
        if changed is not None:
            await self._write(inbound, lambda tx: self._finish(tx, inbound, call, changed))
            return replace(call, status=CallStatus.DONE, result=changed.to_json()), changed, True
        side_effect = tool.risk_for(call.args) != Risk.READ
        if side_effect:
            fence, session = self.fence, inbound.session_key

            def start(tx: Tx) -> None:
                if fence is not None:
                    fence(tx, session)
                tx.turns.set_call(call.id, CallStatus.STARTED)

            await self.store.run(start)
        result = await self.registry.execute(tool.name, call.args, ctx)
        result.output = self.masker.mask(result.output)
        # What a tool keeps beside its output (an MCP server's resources) is stored too.
        result.data = self.masker.mask_data(result.data, by_key=False)
        # A read-only call may run again after a crash, unless someone approved it once.
        record_now = side_effect or call.approval_id is not None
        if record_now:
            await self._write(inbound, lambda tx: self._finish(tx, inbound, call, result))
        done = replace(call, status=CallStatus.DONE, result=result.to_json())
        return done, result, record_now

    def _changed_since_checked(
        self, tool: Tool, call: CallRow, ctx: ToolContext
    ) -> ToolResult | None:
        """A call that runs unasked is judged again right before it runs: what decides
        its effect may have changed since it was settled (a file of the requester's
        inbox swapped for a link to the owner's). If no grant could waive what it asks
        for now, it does not run."""
        now = self.registry.get(tool.name)  # what execute() will run
        if now is not tool and (now is None or _identity(now, call) != _identity(tool, call)):
            # Listed anew meanwhile (an MCP server): the name may be another remote tool's
            # now, or rated otherwise, and neither was what was judged or approved.
            return ToolResult.failure(
                ErrorCode.TOOL_UNAVAILABLE,
                f"{tool.name} was not run: its server listed its tools anew since the call"
                " was checked, and it is not the same tool now; ask again.",
            )
        if call.approval_id is not None:
            return None  # an approver consented to exactly this call
        verdict = self.live.current.policy.judge(tool, call.args, ctx, granted=lambda _: True)
        if not verdict.asks:
            return None
        return ToolResult.failure(
            ErrorCode.PERMISSION_DENIED,
            f"{tool.name} was not run: what it would do changed since it was checked "
            f"({verdict.reason}); ask again.",
        )


def _identity(tool: Tool, call: CallRow) -> tuple[object, ...]:
    """What a call was judged on: the tool behind the name (an MCP tool's server and
    remote name) and the risk it has for these arguments."""
    return (getattr(tool, "server", None), getattr(tool, "remote_name", None),
            tool.risk_for(call.args))  # fmt: skip


async def run_fenced(
    store: Store,
    fence: Callable[[Tx, str], None] | None,
    session_key: str,
    write: Callable[[Tx], T],
) -> T:
    """Commit ``write``, a checkpoint of a turn of ``session_key`` — with several daemons
    (``fence`` set: ``Cluster.fence``), only while this one still drives the session
    (LeaseLost otherwise, and nothing of it is written)."""
    if fence is None:
        return await store.run(write)

    def fenced(tx: Tx) -> T:
        fence(tx, session_key)
        return write(tx)

    return await store.run(fenced)


def _set(tx: Tx, call: CallRow, status: CallStatus, *, approval_id: str | None = None) -> CallRow:
    """Move ``call`` to ``status`` in the store; the call as it is stored now."""
    tx.turns.set_call(call.id, status, approval_id=approval_id)
    if approval_id is None:
        return replace(call, status=status)
    return replace(call, status=status, approval_id=approval_id)
