"""Approval requests: created durably with their prompt, decided once (compare-and-set),
expired when their time is up. No coroutine ever waits on a request."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any, Protocol

from .. import metrics
from ..config import LoadedConfig, console_base
from ..dates import clock_text
from ..events import (
    Address,
    ApprovalDecision,
    ApprovalView,
    Button,
    DecisionVerb,
    OutboundKind,
    OutboundMessage,
    Sender,
    approval_action,
    new_id,
)
from ..plugins import is_local
from ..secrets import Masker
from ..statuses import ApprovalStatus
from ..store import Tx
from ..store.approvals import ApprovalRow, NewApproval
from ..tools.base import Risk
from .display import (
    ADDRESS_CLIP,
    NAME_CLIP,
    REASON_CLIP,
    TOOL_CLIP,
    clip,
    decider,
    escape_text,
    order_args,
    render_call,
    render_if_fits,
)
from .routing import OWNER_QUEUE, VIA_CONSOLE, ApproverDirectory

ALLOW_FOR_SECONDS = 3600

# Why a chat cannot show a call; the console shows a call of any length, never a secret.
TOO_LONG = "are too long to show here completely"
SECRET_KEYS = "hold values under secret-named keys, which a chat never shows"


def call_fits_console(unshown: str) -> bool:
    return unshown == TOO_LONG


__all__ = ["ALLOW_FOR_SECONDS", "ApprovalGate", "DecisionOutcome", "render_call"]


def _clock_text(ts: float, zone: str) -> str:
    return clock_text(ts, zone)


def _scope_text(scope: str | None) -> str:
    """What a grant covers beside the tool, as the outcome line says it."""
    if not scope or scope == "[]":
        return ""
    return f", for {clip(escape_text(scope), ADDRESS_CLIP)} only"


def allow_for_text(tool: str, chat: Address | str, scope: str | None) -> str:
    """What "Allow here for 1 h" grants, as the console shows it before it is pressed
    (a chat prompt, bounded in size, says it once decided)."""
    return (
        f"Allow here for 1 h: {clip(escape_text(tool), TOOL_CLIP)} runs unasked in"
        f" {clip(str(chat), ADDRESS_CLIP)} for an hour{_scope_text(scope)}."
    )


class Refusal(StrEnum):
    """Why a decision changed nothing."""

    UNKNOWN = "unknown"  # no such request
    DECIDED = "decided"  # decided already (or expired) by someone else
    FORBIDDEN = "forbidden"  # the sender may not decide it here
    EXPIRED = "expired"  # its time was up (the request is expired by this decision)
    VERB = "verb"  # the verb is not offered for this request


@dataclass(slots=True)
class DecisionOutcome:
    """What applying a decision (or an expiry) did: the request's status afterwards, or
    why nothing changed."""

    message: str
    approval: ApprovalRow | None = None
    status: ApprovalStatus | None = None  # the request's status after it, when applied
    refused: Refusal | None = None
    resume_turns: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.refused is None


class _Settings(Protocol):
    @property
    def directory(self) -> ApproverDirectory: ...

    @property
    def approval_timeout(self) -> timedelta: ...

    @property
    def loaded(self) -> LoadedConfig: ...


class CurrentSettings(Protocol):
    """What the gate reads of ``live.Live`` (the package stays below ``live``, which
    names the policy and the approvers)."""

    @property
    def current(self) -> _Settings: ...


@dataclass(frozen=True, slots=True)
class Ask:
    """A call that needs consent, as a turn asks the gate for it (``request``)."""

    turn_id: str
    session_key: str
    trace_id: str
    tool: str
    args: dict[str, Any]
    args_hash: str
    risk: Risk
    reason: str  # the policy's words for why it asks
    requester: Sender
    origin: Address
    prompt_to: Address
    key_args: Sequence[str] = ()  # shown first
    # What "Allow here for a time" would grant beside the tool; None: not offered.
    grant_scope: str | None = None


class ApprovalGate:
    def __init__(
        self,
        live: CurrentSettings,
        masker: Masker,
        clock: Callable[[], float] = time.time,
        timezone: str = "UTC",
    ) -> None:
        self.live = live  # the approvers and the timeout, as the last reload left them
        self.masker = masker
        self.clock = clock
        self.timezone = timezone  # [bot] timezone: times in a chat that chose none

    def _zone(self, tx: Tx, chat: Address) -> str:
        """The time zone a chat reads times in: its own (``/timezone``), else the bot's."""
        return tx.reminders.chat_timezone(str(chat)) or self.timezone

    # -- creating a request ------------------------------------------------------------
    def request(self, tx: Tx, ask: Ask) -> str:
        """Store a request and queue its prompt (in the caller's transaction).

        The arguments are stored in the order they are shown — the ones the tool
        declares as deciding (``key_args``) first — so every later view (the edited
        prompt, ``/approvals``, ``echo-bot approvals show``) shows that order too.
        ``ask.grant_scope``: what "Allow here for a time" would grant beside the tool,
        when the policy offers it for this call (None: it is not offered, nor accepted)."""
        tool, risk, reason, requester = ask.tool, ask.risk, ask.reason, ask.requester
        origin, prompt_to, trace_id = ask.origin, ask.prompt_to, ask.trace_id
        approval_id = new_id()
        expires_at = self.clock() + self.live.current.approval_timeout.total_seconds()
        args = order_args(ask.args, ask.key_args)
        allow_for = self._allow_for_offered(ask.grant_scope, requester.id, origin, prompt_to)
        prompt = self._prompt(
            approval_id,
            tool,
            args,
            risk,
            reason,
            requester,
            origin,
            prompt_to,
            expires_at,
            allow_for=allow_for,
            zone=self._zone(tx, prompt_to),
        )
        prompt = prompt.model_copy(
            update={
                "trace_id": trace_id,
                "metadata": {**prompt.metadata, "inbound_id": ask.turn_id},
            }
        )
        queued = prompt_to == OWNER_QUEUE  # no chat can prompt: nothing is sent
        if not queued:
            tx.outbox.add(prompt)
        tx.approvals.insert(
            NewApproval(
                id=approval_id,
                turn_id=ask.turn_id,
                session_key=ask.session_key,
                trace_id=trace_id,
                tool=tool,
                args=args,
                args_hash=ask.args_hash,
                risk=risk.value,
                requested_by={"id": requester.id, "name": requester.name, "address": str(origin)},
                origin=str(origin),
                prompt_to=str(prompt_to),
                prompt_outbound_id=None if queued else prompt.id,
                expires_at=expires_at,
                grant_scope=ask.grant_scope if allow_for else None,
                reason=reason,
            )
        )
        tx.on_commit(lambda: metrics.APPROVALS.labels("requested").inc())
        tx.audit.write(
            "approval.requested",
            trace_id=trace_id,
            session_key=ask.session_key,
            approval_id=approval_id,
            tool=tool,
            args=args,
            risk=risk.value,
            reason=reason,
            prompt_to=str(prompt_to),
        )
        if prompt_to != origin:
            where = (
                f"no chat can ask an approver, so it waits for the owner at the server: "
                f"echo-bot approvals approve {approval_id} (or deny), until "
                f"{_clock_text(expires_at, self._zone(tx, origin))}"
                if queued
                else f"the request went to the approvers (id {approval_id})"
            )
            tx.outbox.add(
                OutboundMessage(
                    to=origin,
                    text=f"⏳ {escape_text(tool)} needs approval; {where}.",
                    kind=OutboundKind.NOTICE,
                    trace_id=trace_id,
                    metadata={"inbound_id": ask.turn_id},
                ),
            )
        return approval_id

    def reprompt(self, tx: Tx, row: ApprovalRow) -> OutboundMessage:
        """The prompt of a pending request again, with its buttons (``/approvals``)."""
        requested = row.requested_by
        requester = Sender(id=str(requested.get("id", "")), name=str(requested.get("name", "")))
        prompt = self._prompt(
            row.id,
            row.tool,
            row.args,
            Risk(row.risk),
            "still pending",
            requester,
            Address.parse(row.origin),
            Address.parse(row.prompt_to),
            row.expires_at,
            allow_for=self._allow_for_offered(
                row.grant_scope,
                requester.id,
                Address.parse(row.origin),
                Address.parse(row.prompt_to),
            ),
            zone=self._zone(tx, Address.parse(row.prompt_to)),
        )
        return prompt.model_copy(update={"trace_id": row.trace_id})

    def _allow_for_offered(
        self, grant_scope: str | None, requester_id: str, origin: Address, prompt_to: Address
    ) -> bool:
        """ "Allow for a time" only where the policy offered it for the call (a write, no
        rule of its own that asks) and it is asked in the requester's own chat of an
        approver there (checked again here, with the approvers as they are now): the
        grant covers that chat, so it is never made from another chat (a routed prompt)
        or for someone who may not approve."""
        if grant_scope is None or prompt_to != origin:
            return False
        return self.live.current.directory.approves(origin, requester_id)

    def _prompt(
        self,
        approval_id: str,
        tool: str,
        args: dict[str, Any],
        risk: Risk,
        reason: str,
        requester: Sender,
        origin: Address,
        prompt_to: Address,
        expires_at: float,
        *,
        allow_for: bool,
        zone: str,
    ) -> OutboundMessage:
        call, unshown = self._chat_view(tool, args, prompt_to)
        lines = [
            f"🔐 Approval needed — {clip(tool, TOOL_CLIP)} "
            f"({risk.value}: {clip(reason, REASON_CLIP)})"
        ]
        deny = Button(label="Deny", action=approval_action(DecisionVerb.DENY, approval_id))
        if call is not None:
            lines.append(call)
            row = [
                Button(
                    label="Approve once",
                    action=approval_action(DecisionVerb.APPROVE_ONCE, approval_id),
                )
            ]
            if allow_for:
                row.append(
                    Button(
                        label="Allow here for 1 h",
                        action=approval_action(
                            DecisionVerb.ALLOW_FOR, approval_id, ALLOW_FOR_SECONDS
                        ),
                    )
                )
            buttons = [[*row, deny]]
        else:
            names = ", ".join(clip(k, NAME_CLIP) for k in list(args)[:8])
            more = f", … ({len(args)} in all)" if len(args) > 8 else ""
            lines.append(
                f"The arguments ({names}{more}) {unshown}, so this chat can only deny. "
                + self._elsewhere(approval_id, console=call_fits_console(unshown))
            )
            buttons = [[deny]]
        who = clip(requester.name or requester.id, NAME_CLIP)
        lines.append(
            f"Asked by {who} in {clip(str(origin), ADDRESS_CLIP)} · "
            f"expires {_clock_text(expires_at, zone)}"
        )
        lines.append(f"Request {approval_id}")
        return OutboundMessage(
            to=prompt_to,
            text="\n".join(lines),
            buttons=buttons,
            kind=OutboundKind.APPROVAL,
            approval=ApprovalView(
                request_id=approval_id, risk=risk.value, expires_at=expires_at, call=call
            ),
        )

    def _elsewhere(self, approval_id: str, *, console: bool) -> str:
        """Where a call a chat cannot show may be read and approved: the console when it
        is on and can show it, and the server."""
        config = self.live.current.loaded.config
        server = (
            f"Read them with: echo-bot approvals show {approval_id} — and approve "
            f"there with: echo-bot approvals approve {approval_id}"
        )
        if not (console and config.console.enabled):
            return server
        return (
            f"Read and approve them in the console: {console_base(config)}/console/"
            f"approvals/{approval_id} — or on the server: echo-bot approvals show {approval_id}"
        )

    # -- deciding ----------------------------------------------------------------------
    def decide(self, tx: Tx, decision: ApprovalDecision) -> DecisionOutcome:
        """Apply one decision (in the caller's transaction). Refusals change nothing."""
        row = tx.approvals.get(decision.request_id)
        if row is None:
            return DecisionOutcome("Unknown or expired request.", refused=Refusal.UNKNOWN)
        who = {
            "address": str(decision.decided_by),
            "sender_id": decision.sender_id,
            "via": decision.via,
        }
        if row.status != ApprovalStatus.PENDING:
            return DecisionOutcome(f"Already decided: {row.status}.", row, refused=Refusal.DECIDED)
        if not self._may_decide(tx, row, decision):
            tx.audit.write(
                "approval.refused",
                trace_id=row.trace_id,
                session_key=row.session_key,
                approval_id=row.id,
                decided_by=who,
                reason="not an approver here",
            )
            return DecisionOutcome(
                "You are not allowed to decide this request.", row, refused=Refusal.FORBIDDEN
            )
        if row.expired_at(self.clock()):
            outcome = self._expire(tx, row)
            if outcome.ok:  # expired now, by this decision: the turn goes on
                outcome.refused = Refusal.EXPIRED
                outcome.message = "This request has expired."
            return outcome
        refusal = self._refuse_verb(tx, row, decision)
        if refusal is not None:
            return DecisionOutcome(refusal, row, refused=Refusal.VERB)
        verb = decision.verb
        status = ApprovalStatus.DENIED if verb is DecisionVerb.DENY else ApprovalStatus.APPROVED
        if not tx.approvals.decide(row.id, status, verb=verb.value, decided_by=who):
            return DecisionOutcome("Already decided.", row, refused=Refusal.DECIDED)
        tx.on_commit(lambda: metrics.APPROVALS.labels(status).inc())
        if verb is DecisionVerb.ALLOW_FOR:
            # Never longer than the button offered: its data can be forged.
            seconds = min(decision.allow_for_seconds or ALLOW_FOR_SECONDS, ALLOW_FOR_SECONDS)
            # Keyed by the chat (prompt_to == origin here), the tool and the scope the
            # prompt showed; the policy lets only that chat's approvers use it.
            assert row.grant_scope is not None  # _refuse_verb says so
            chat = Address.parse(row.prompt_to).session_key
            tx.grants.add(chat, row.tool, row.grant_scope, self.clock() + seconds, row.id)
        tx.audit.write(
            "approval.decided",
            trace_id=row.trace_id,
            session_key=row.session_key,
            approval_id=row.id,
            tool=row.tool,  # so a filter by tool shows who decided, too
            status=status,
            verb=verb.value,
            decided_by=who,
        )
        label = {ApprovalStatus.APPROVED: "✅ Approved", ApprovalStatus.DENIED: "❌ Denied"}[status]
        zone = self._zone(tx, Address.parse(row.prompt_to))
        text = f"{label} by {decider(who)} at {_clock_text(self.clock(), zone)}"
        if verb is DecisionVerb.ALLOW_FOR:
            text += (
                f"; {escape_text(row.tool)} runs unasked in this chat until "
                f"{_clock_text(self.clock() + seconds, zone)}{_scope_text(row.grant_scope)}"
            )
        self._edit_prompt(tx, row, text)
        return DecisionOutcome(
            f"{label.split(' ', 1)[1]}.", row, status=status, resume_turns=[row.turn_id]
        )

    def _refuse_verb(self, tx: Tx, row: ApprovalRow, decision: ApprovalDecision) -> str | None:
        """Why this verb may not be applied to this request (None: it may). Checked here,
        not only by which buttons were shown: button data can be forged."""
        verb = decision.verb
        if verb is DecisionVerb.DENY:
            return None
        if decision.via == VIA_CONSOLE:
            if self._secret_unshown(row):
                return (
                    "The arguments hold values under secret-named keys, which the console "
                    f"does not show; read them with `echo-bot approvals show {row.id}` on "
                    "the server and approve there."
                )
        elif decision.via != "admin" and self._unshown(row, decision.decided_by):
            return (
                "The arguments could not be shown in chat (too long to show in chat, or "
                "secret); read them with "
                f"`echo-bot approvals show {row.id}` and approve there."
            )
        if verb is not DecisionVerb.ALLOW_FOR:
            return None
        if row.risk != Risk.WRITE:
            return "Allow-for-a-time is offered only for write tools."
        requester = str(row.requested_by.get("id", ""))
        origin, prompt_to = Address.parse(row.origin), Address.parse(row.prompt_to)
        if not self._allow_for_offered(row.grant_scope, requester, origin, prompt_to):
            return (
                "Allow-for-a-time is offered only for a write asked in the requester's own "
                "chat, when the requester approves there, and never for a call that asks "
                "because of what it does (another chat, the owner's data); approve this "
                "request once or deny it."
            )
        return None

    def _may_decide(self, tx: Tx, row: ApprovalRow, decision: ApprovalDecision) -> bool:
        if decision.via == "admin":  # the owner at the server, through `echo-bot approvals`
            return True
        directory = self.live.current.directory
        if decision.via == VIA_CONSOLE:  # shows every argument: any length may be approved
            requester = str(row.requested_by.get("id", ""))
            return directory.console_decides(
                row.prompt_to, requester, decision.decided_by, decision.sender_id, row.origin,
                tx.inbox.direct_with(row.prompt_to),
            )  # fmt: skip
        if str(decision.decided_by) != row.prompt_to:
            return False
        return directory.is_approver(tx, decision.decided_by, decision.sender_id)

    def _unshown(self, row: ApprovalRow, chat: Address) -> bool:
        """A call whose prompt in ``chat`` offered only Deny (DESIGN: never approve
        unseen)."""
        return self._chat_view(row.tool, row.args, chat)[0] is None

    def _secret_unshown(self, row: ApprovalRow) -> bool:
        """A call with values under secret-named keys: masked wherever people look."""
        masked: bool = self.masker.mask_data(row.args) != self.masker.mask_data(
            row.args, by_key=False
        )
        return masked

    def console_view(self, row: ApprovalRow) -> tuple[str, bool]:
        """The call as the console shows it (every argument, whatever its length; secrets
        masked) and whether it may be approved there."""
        shown = self.masker.mask_data(row.args)
        return render_call(row.tool, shown), not self._secret_unshown(row)

    def _chat_view(self, tool: str, args: dict[str, Any], chat: Address) -> tuple[str | None, str]:
        """The call as ``chat`` shows it, or None and why it cannot show it completely:
        too long for one message (the terminal shows any length), or a value under a
        secret-named key (masked for people, so it would be approved unseen — an
        ``X-Api-Token`` header can carry any data out). Values of configured secrets are
        masked and do not count as unseen: the approver knows which secret goes there."""
        shown = self.masker.mask_data(args, by_key=False)
        if self.masker.mask_data(args) != shown:
            return None, SECRET_KEYS
        if is_local(chat.channel):
            return render_call(tool, shown), ""
        call = render_if_fits(tool, shown)
        return call, "" if call is not None else TOO_LONG

    # -- grants ------------------------------------------------------------------------
    def granted(self, tx: Tx, address: Address, tool: str, scope: str) -> bool:
        """Whether a live "allow for a time" grant covers a call of ``tool`` in this chat
        (the address, thread included) whose deciding arguments make ``scope``.

        Who may use it is the policy's row: only the approvers of that chat (in a group,
        approver A's grant never lets a non-approver's call run unasked, nor a
        webhook's or cron's, whose origins have no approvers)."""
        return tx.grants.holds(address.session_key, tool, scope, self.clock())

    def _edit_prompt(self, tx: Tx, row: ApprovalRow, outcome: str) -> None:
        if not row.prompt_outbound_id:
            return
        call, _ = self._chat_view(row.tool, row.args, Address.parse(row.prompt_to))
        if call is None:
            call = (
                f"{clip(row.tool, TOOL_CLIP)}: the arguments cannot be shown here; "
                f"see echo-bot approvals show {row.id}"
            )
        tx.outbox.add(
            OutboundMessage(
                to=Address.parse(row.prompt_to),
                text=f"{outcome}\n{call}\nRequest {row.id}",
                kind=OutboundKind.APPROVAL,
                edit_of=row.prompt_outbound_id,
                trace_id=row.trace_id,
                approval=ApprovalView(request_id=row.id, outcome=outcome),
            ),
        )

    # -- expiry ------------------------------------------------------------------------
    def _expire(self, tx: Tx, row: ApprovalRow) -> DecisionOutcome:
        if not tx.approvals.decide(row.id, ApprovalStatus.EXPIRED, verb=None, decided_by=None):
            return DecisionOutcome("Already decided.", row, refused=Refusal.DECIDED)
        tx.on_commit(lambda: metrics.APPROVALS.labels(ApprovalStatus.EXPIRED).inc())
        tx.audit.write(
            "approval.expired",
            trace_id=row.trace_id,
            session_key=row.session_key,
            approval_id=row.id,
        )
        self._edit_prompt(tx, row, "⌛ Expired")
        return DecisionOutcome(
            "Expired.", row, status=ApprovalStatus.EXPIRED, resume_turns=[row.turn_id]
        )

    def expire_due(self, tx: Tx) -> list[str]:
        """Expire every pending request whose time is up; return the turns to resume."""
        turns: list[str] = []
        for approval_id in tx.approvals.due_for_expiry(self.clock()):
            row = tx.approvals.get(approval_id)
            if row is not None:
                turns += self._expire(tx, row).resume_turns
        return turns
