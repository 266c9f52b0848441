"""Approval requests as the console shows them, and which ones a person may see.

A person signed in sees exactly the requests they may decide (``ApproverDirectory.
console_decides``): the owner every one, an approver those the prompt's buttons would let
them decide. The call is shown as ``approvals/display.py`` renders it — every argument,
whatever its length, deciding ones first, hidden characters as escapes — with values
under secret-named keys masked (such a call is Deny-only here, as in a chat).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..approvals.display import decider, fits, show_json
from ..approvals.gate import ApprovalGate, allow_for_text
from ..approvals.routing import OWNER_QUEUE, ApproverDirectory
from ..events import Address
from ..plugins import is_local
from ..statuses import ApprovalStatus
from ..store import Tx
from ..store.approvals import ApprovalRow
from .auth import ConsoleUser

# Decided requests the queue page keeps showing, for this long (seconds).
RECENT = 15 * 60
# Requests read per page of the queue or the history.
PAGE = 100


@dataclass(frozen=True, slots=True)
class RequestView:
    id: str
    tool: str
    risk: str
    reason: str
    call: str  # tool(arg=value, …), complete, escaped
    args_json: str  # indented JSON, escaped
    approvable: bool  # no secret-named values: Approve may be offered
    allow_for: bool  # "Allow here for a time" was offered in the chat, and is here
    allow_scope: str  # what it grants (the tool, the chat, the scope), shown before
    chat_could_show: bool  # False: the chat prompt offered Deny only
    asked_by: str
    origin: str
    prompt_to: str
    created_at: float
    expires_at: float
    status: str
    verb: str | None
    decided_by: str
    decided_at: float | None

    @property
    def pending(self) -> bool:
        return self.status == ApprovalStatus.PENDING


def view(gate: ApprovalGate, row: ApprovalRow, *, brief: bool = False) -> RequestView:
    """The request as shown; ``brief``: for a list of outcomes, without the call (whose
    rendering and masking is most of a page's time)."""
    call, approvable = ("", False) if brief else gate.console_view(row)
    requester = row.requested_by
    prompt_to = (
        "no chat (waits for the owner)" if row.prompt_to == str(OWNER_QUEUE) else row.prompt_to
    )
    return RequestView(
        id=row.id,
        tool=row.tool,
        risk=row.risk,
        reason=row.reason,
        call=call,
        args_json="" if brief else show_json(gate.masker.mask_data(row.args)),
        approvable=approvable,
        allow_for=row.grant_scope is not None and row.risk == "write",
        allow_scope=allow_for_text(
            row.tool, row.prompt_to, row.grant_scope and gate.masker.mask(row.grant_scope)
        ),  # a scope is the call's arguments: masked as the call is
        # The terminal shows a call of any length; a chat prompt as much as fits.
        chat_could_show=approvable
        and (fits(call) or is_local(Address.parse(row.prompt_to).channel)),
        asked_by=str(requester.get("name") or requester.get("id") or "?"),
        origin=row.origin,
        prompt_to=prompt_to,
        created_at=row.created_at,
        expires_at=row.expires_at,
        status=str(row.status),
        verb=row.verb,
        decided_by=decider(row.decided_by),
        decided_at=row.decided_at,
    )


SCAN_BATCH = 200  # decided requests read at a time for a page of History
SCAN_MAX = 5_000  # read at most for one page: older pages of a busy store end there


def may_see(tx: Tx, directory: ApproverDirectory, user: ConsoleUser, row: ApprovalRow) -> bool:
    """What the gate lets ``user`` decide from the console (``console_decides``), read
    with the same facts: whose direct chat the prompt's chat is."""
    requester = str(row.requested_by.get("id", ""))
    direct = None if user.owner else tx.inbox.direct_with(row.prompt_to)
    return directory.console_decides(
        row.prompt_to, requester, user.address, user.id, row.origin, direct
    )


def pending(
    tx: Tx, gate: ApprovalGate, directory: ApproverDirectory, user: ConsoleUser
) -> list[RequestView]:
    """The pending requests ``user`` may decide, newest first."""
    rows = tx.approvals.list(ApprovalStatus.PENDING, limit=PAGE * 10)
    seen = [view(gate, row) for row in reversed(rows) if may_see(tx, directory, user, row)]
    return seen[:PAGE]


def decided(
    tx: Tx,
    gate: ApprovalGate,
    directory: ApproverDirectory,
    user: ConsoleUser,
    *,
    since: float | None = None,
    limit: int = PAGE,
    offset: int = 0,
) -> list[RequestView]:
    """Requests no longer pending that ``user`` may see, newest first (decided since
    ``since`` only, when given): ``limit`` of them after the first ``offset`` *they may
    see*. The store is read in batches until then (at most SCAN_MAX rows): filtered
    after one read of ``limit`` rows, an approver's page came out empty whenever others'
    chats had the newest decisions, and its "Older" link went with it."""
    seen: list[RequestView] = []
    skip, read = offset, 0
    while len(seen) < limit and read < SCAN_MAX:
        rows = tx.approvals.decided(since=since, limit=SCAN_BATCH, offset=read)
        read += len(rows)
        for row in rows:
            if not may_see(tx, directory, user, row):
                continue
            if skip:
                skip -= 1
            elif len(seen) < limit:
                seen.append(view(gate, row, brief=True))
        if len(rows) < SCAN_BATCH:
            break
    return seen


def one(
    tx: Tx, gate: ApprovalGate, directory: ApproverDirectory, user: ConsoleUser, approval_id: str
) -> RequestView | None:
    row = tx.approvals.get(approval_id)
    if row is None or not may_see(tx, directory, user, row):
        return None
    return view(gate, row)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an approved call did: its result as the audit log has it."""

    ok: bool
    error_code: str
    output: str  # the first characters (masked again when shown)


OUTCOME_OUTPUT = 2000  # characters of a call's output shown


def outcome(tx: Tx, request_id: str) -> Outcome | None:
    """The result of the call ``request_id`` approved (None: not approved, or it has not
    finished): the ``tool.result`` audit row that names the request (a row written
    before rows named it: the first of its tool in its trace after the decision; a later
    call of the same tool in the turn is another call)."""
    row = tx.approvals.get(request_id)
    if row is None or row.status != ApprovalStatus.APPROVED or row.decided_at is None:
        return None
    for audit in tx.audit.read(tail=500, trace_id=row.trace_id):
        data = audit.data
        if audit.kind != "tool.result" or data.get("tool") != row.tool:
            continue
        named = data.get("approval_id")
        if named == request_id or ("approval_id" not in data and audit.ts + 1 >= row.decided_at):
            return Outcome(
                ok=bool(data.get("ok")),
                error_code=str(data.get("error_code") or ""),
                output=str(data.get("output") or "")[:OUTCOME_OUTPUT],
            )
    return None
