"""One turn, driven as a durable state machine.

``advance`` is idempotent: it reads the turn's checkpoint and moves it as far as it can
go now — asking the brain, running calls, suspending on approvals, finishing with a
reply. Recovery after a crash is just ``advance`` again.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from functools import partial
from typing import TypeVar

from .. import metrics
from ..brains.base import Brain
from ..brains.llm_prompt import summary_cut
from ..commands.registry import CommandRegistry, summarise_results, trailing_results
from ..config import BrainConfig
from ..conversation import BrainContext, BrainReply, ChatMessage, FileNote, ToolCall
from ..errors import EchoBotError, LeaseLost, StoreUnavailable
from ..events import (
    InboundMessage,
    InboundStatus,
    MessageInbound,
    OutboundKind,
    OutboundMessage,
    TextFormat,
    ToolCallInbound,
    is_new_id,
    new_id,
)
from ..logs import current_session, current_trace
from ..media.inbound import MediaPreparer, PreparedMessage
from ..memory_notes import prompt_lines
from ..previews import Previews
from ..secrets import Masker
from ..statuses import TurnStatus
from ..store import HistoryReset, Store, Tx
from ..store.turns import CallRow, TurnRow
from ..tools.base import ErrorCode, Tool, ToolResult
from ..tools.registry import ToolRegistry
from .calls import CallExecutor, StepProgress, args_hash, run_fenced
from .history import HistoryCache
from .summary_pages import summary_page

log = logging.getLogger(__name__)

HISTORY_LIMIT = 200
MAX_BEGUN_HERE = 1_000
# A model asking for the very same call (name and arguments) this often in one turn is
# looping; the turn ends with an honest message.
MAX_IDENTICAL_CALLS = 2
# Tool calls of one step that are kept and run; the model asks for the rest in its next
# step if it still wants them (300 send_message calls in one answer went out at once,
# and the step's rows pushed the turn's own question out of the next prompt).
MAX_CALLS_PER_STEP = 16
# Summary requests one turn makes at most, each within [brain] context_chars (three
# quarters of it the messages, the rest the summary so far): a long stretch never
# summarised (a chat that had no model before) is caught up over the next turns.
MAX_SUMMARY_PAGES = 3

T = TypeVar("T")


class Phase(Enum):
    """Where a message turn is: a step's calls to run, or the brain to ask."""

    RUN_CALLS = "run calls"
    THINK = "think"


@dataclass(frozen=True)
class Recall:
    """What a brain step thinks on, read in one transaction: the session's history and,
    for a brain that reads them, the chat's memory notes and chosen model."""

    messages: list[ChatMessage]
    notes: tuple[str, ...] = ()
    model: str | None = None
    summary: str | None = None  # of the messages before ``messages``
    seqs: tuple[int, ...] = ()  # each message's seq, for a brain that reads the chat
    summary_upto: int = 0  # the seq of the newest message the summary covers
    # The window is full and the summary does not reach it: messages stored before it
    # (seq below this one) may be in neither (``summary_pages``).
    older_before: int | None = None


class _NotFresh(EchoBotError):
    """A turn started in memory (``TurnRunner._start_here``) was found started or finished
    in the store when its start was written: nothing of that checkpoint is committed."""


class NotHeldAfterAll(EchoBotError):
    """A turn run as if this daemon still held its session (``advance(..., held=True)``)
    found at its first checkpoint that it does not, or that an earlier turn of the
    session waits: nothing of the turn is committed; take the session first."""


@dataclass
class _Turn:
    """A message turn as its phases leave it for the next."""

    turn: TurnRow
    conversation: Recall | None  # the history (and notes) for the next brain step, if read
    settled: list[CallRow] | None = None  # the step's calls as just stored and settled
    # A turn made by this process: each of its calls' args_hash, counted as committed
    # (what the store would answer); None for a turn resumed from the store.
    made: Counter[str] | None = None


class TurnRunner:
    def __init__(
        self,
        *,
        store: Store,
        brain: Brain,
        commands: CommandRegistry,
        registry: ToolRegistry,
        exposed: Callable[[], Sequence[Tool]],
        executor: CallExecutor,
        masker: Masker,
        config: BrainConfig,
        media: MediaPreparer,
        previews: Previews | None = None,
        fence: Callable[[Tx, str], None] | None = None,
    ) -> None:
        self.store = store
        self.media = media
        self.previews = previews
        # With several daemons: raises LeaseLost in a checkpoint's transaction unless
        # this daemon still drives the session (``Cluster.fence``).
        self.fence = fence
        self.brain = brain
        self.commands = commands
        self.registry = registry
        self.exposed = exposed
        self.executor = executor
        self.masker = masker
        self.config = config
        # Only the daemon driving a session writes its history, so the cache is not read
        # on: on SQLite this daemon drives every session; with several daemons, whoever
        # takes a session's lease after a break forgets what it kept of it
        # (``Cluster.on_break``, wired by the runtime).
        self.history = HistoryCache(HISTORY_LIMIT, exclusive=True)
        store.subscribe(HistoryReset, lambda reset: self.history.forget(reset.session_key))
        # Only a model reads the chat's notes and model choice: the rules brain's turns
        # do not read them.
        self.reads_chat = bool(getattr(brain, "reads_chat", False))
        # A brain that answers in this process at once (the rules brain): between its
        # steps nothing slow happens, so a checkpoint that only writes can wait for the
        # next one and go in the same commit (``_defer``). Not with a model to wait for:
        # a crash then would cost its answer again.
        self.writes_later = bool(getattr(brain, "local", False))
        self._deferred: dict[str, list[Callable[[Tx], None]]] = {}  # by inbound id
        # Turns run as if their session's lease were still held, until their first
        # checkpoint shows it (``advance``'s ``held``).
        self._presumed: set[str] = set()
        # Turns started in memory and not finished (an ordered set, bounded).
        self._begun_here: dict[str, None] = {}

    def _recall(self, tx: Tx, session_key: str) -> Recall:
        if not self.reads_chat:
            return Recall(self.history.load(tx, session_key))
        rows = self.history.load_rows(tx, session_key)
        summary = tx.summaries.of(session_key)
        older_before = None
        if len(rows) >= self.history.limit and (summary is None or summary.upto_seq < rows[0][0]):
            older_before = rows[0][0]
        if summary is not None:  # what it covers is carried as the summary instead
            rows = summary.after(rows)
        return Recall(
            [message for _seq, message in rows],
            prompt_lines(tx.memory.of(session_key)),
            tx.reminders.chat_model(session_key),
            summary.text if summary is not None else None, tuple(seq for seq, _m in rows),
            summary.upto_seq if summary is not None else 0, older_before,
        )  # fmt: skip

    async def advance(
        self, inbound_id: str, known: InboundMessage | None = None, *, held: bool = False
    ) -> None:
        """Move the turn of inbox row ``inbound_id`` as far as it can go now (``known``:
        the message itself, when the caller has it: then only its status is read, or, for
        a new turn that can start in memory, nothing: ``_start_here``).

        ``held``: with several daemons, the caller has held the session's lease since its
        last turn and has not taken it for this one. Only a turn that starts in memory
        goes on so: its first checkpoint checks that the lease is still this daemon's
        (the fence) and that no earlier turn of the session waits (``InboxRepo.expect_first``),
        and raises NotHeldAfterAll if not — as at once for any other turn."""
        if held and (known is None or inbound_id in self._begun_here):
            raise NotHeldAfterAll(inbound_id)
        if known is not None and inbound_id not in self._begun_here:
            begun_here = self._start_here(known, held=held)
            if held and begun_here is None:
                raise NotHeldAfterAll(inbound_id)
            if begun_here is not None:
                self._begun_here[inbound_id] = None  # tried again: from the store
                while len(self._begun_here) > MAX_BEGUN_HERE:  # failed, never tried again
                    del self._begun_here[next(iter(self._begun_here))]
                try:
                    await self._drive(*begun_here)
                except _NotFresh:
                    log.warning("turn %s had started already; going on from the store", inbound_id)
                else:
                    self._begun_here.pop(inbound_id, None)
                    return
                finally:
                    self._deferred.pop(inbound_id, None)
                    self._presumed.discard(inbound_id)
        try:
            begun = await self.store.run(lambda tx: self._begin(tx, inbound_id, known))
            if isinstance(begun, MessageInbound):  # a new turn with files: ready them first
                prepared = await self.media.prepare(begun)
                begun = await self.store.run(
                    lambda tx: self._begin(tx, inbound_id, known, prepared)
                )
            if begun is None or isinstance(begun, MessageInbound):
                return
            await self._drive(*begun)
        finally:
            self._begun_here.pop(inbound_id, None)
            self._deferred.pop(inbound_id, None)

    async def _drive(
        self, inbound: InboundMessage, turn: TurnRow, conversation: Recall | None
    ) -> None:
        current_trace.set(inbound.trace_id)
        current_session.set(inbound.session_key)
        if isinstance(inbound, ToolCallInbound):
            await self._drive_direct(inbound, turn)
            return
        if not isinstance(inbound, MessageInbound):  # decisions are applied, not turns
            raise ValueError(f"inbound {inbound.id} ({inbound.kind}) has no turn to drive")
        # Derived from the checkpoint: a turn this process has just made has no calls
        # yet (no need to look in the store); any other may have a step to run or
        # resume.
        at = _Turn(turn, conversation)
        phase: Phase | None = Phase.RUN_CALLS
        if turn.step == 0 and conversation is not None:  # just made here: no calls yet
            phase = Phase.THINK
            at.made = Counter()
        while phase is not None:
            if phase is Phase.RUN_CALLS:
                phase = await self._run_calls(inbound, at)
            else:
                phase = await self._think(inbound, at)

    async def _run_calls(self, inbound: MessageInbound, at: _Turn) -> Phase | None:
        """Run what the step's calls may run; close the step when all have results."""
        tools = list(self.exposed())
        progress = await self.executor.run_step(inbound, at.turn, tools, at.settled)
        at.settled = None
        if not progress.calls:  # a step with no calls (resumed before its brain reply)
            return Phase.THINK
        if progress.waiting:
            await self._checkpoint(inbound, partial(self._suspend, inbound=inbound, turn=at.turn))
            return None
        closed: tuple[TurnRow, Recall | None] | None = self._close_here(inbound, at.turn, progress)
        if closed is None:
            closed = await self._checkpoint(
                inbound, partial(self._close_step, inbound=inbound, turn=at.turn, progress=progress)
            )
        at.turn, at.conversation = closed
        return Phase.THINK

    async def _think(self, inbound: MessageInbound, at: _Turn) -> Phase | None:
        """Ask the brain for the next step: calls to run, or the answer."""
        turn = at.turn
        if turn.step >= self.config.max_steps:
            text = (
                f"I stopped after {turn.step} steps without finishing. "
                "Ask again with a narrower request."
            )
            await self._finish(inbound, turn, text, InboundStatus.DONE, "max_steps reached")
            return None
        tools = list(self.exposed())
        reply = await self._ask_brain(inbound, turn, tools, at.conversation)
        at.conversation = None
        if reply is None:
            return None
        if not reply.tool_calls:
            text = reply.text or "(no reply)"
            await self._finish(
                inbound, turn, text, InboundStatus.DONE, None, reply.attachments, decision=reply
            )
            return None
        at.settled = await self._checkpoint(
            inbound,
            partial(
                self._persist_step,
                inbound=inbound,
                turn=turn,
                reply=reply,
                tools=tools,
                made=at.made,
            ),
        )
        if at.settled is None:
            name = reply.tool_calls[0].name
            text = (
                f"I stopped: the same {name} call kept repeating without progress. "
                "Ask again, perhaps more specifically."
            )
            await self._finish(inbound, turn, text, InboundStatus.DONE, "repeated call")
            return None
        return Phase.RUN_CALLS

    async def _drive_direct(self, inbound: ToolCallInbound, turn: TurnRow) -> None:
        """A direct tool call (webhook, cron): one step of one call, planned at the
        first go; its result is the reply, stored with it in one commit."""
        # It may name any available tool; brains see the profile's selection.
        tools = [t for t in self.registry if t.available()]
        progress = await self.executor.run_step(inbound, turn, tools, None)
        if not progress.calls:  # not planned yet
            settled = await self._checkpoint(
                inbound, partial(self._plan_direct, inbound=inbound, turn=turn, tools=tools)
            )
            progress = await self.executor.run_step(inbound, turn, tools, settled)
        if progress.waiting:
            await self._checkpoint(inbound, partial(self._suspend, inbound=inbound, turn=turn))
            return
        await self._finish_direct(inbound, progress.calls, progress.unrecorded)

    # -- checkpoints ----------------------------------------------------------------------
    async def _checkpoint(self, inbound: InboundMessage, write: Callable[[Tx], T]) -> T:
        """Commit ``write``, after what was deferred to this checkpoint (``_defer``)."""
        deferred = self._deferred.pop(inbound.id, None)
        if deferred:

            def with_deferred(tx: Tx) -> T:
                for earlier in deferred:
                    earlier(tx)
                return write(tx)

            # The turn's first checkpoint; ``presumed``: its session's lease not taken for it.
            presumed = inbound.id in self._presumed
            self._presumed.discard(inbound.id)
            try:
                return await run_fenced(self.store, self.fence, inbound.session_key, with_deferred)
            except LeaseLost as exc:
                if presumed:
                    raise NotHeldAfterAll(inbound.id) from exc
                raise
        return await run_fenced(self.store, self.fence, inbound.session_key, write)

    def _defer(self, inbound: InboundMessage, write: Callable[[Tx], None]) -> None:
        """Write ``write`` with the turn's next checkpoint, in its transaction and before
        it. Only what a crash may lose: the turn then goes on from its last commit."""
        self._deferred.setdefault(inbound.id, []).append(write)

    def _start_here(
        self, inbound: InboundMessage, *, held: bool = False
    ) -> tuple[MessageInbound, TurnRow, Recall] | None:
        """A new message turn started in memory, with no read (``writes_later``, the
        session's history held by the cache, no files to ready); its start (the inbound
        running, the turn, the user's words in the history) written with its first
        checkpoint, which fails with ``_NotFresh`` if the store had started it already
        (and, ``held``, with NotHeldAfterAll if an earlier turn of the session waits).
        Not a command: one may write to the store itself, after its turn's start."""
        if not self.writes_later or not isinstance(inbound, MessageInbound) or inbound.attachments:
            return None
        if self.commands.parse(inbound.text or "") is not None:
            return None  # a command may write itself (/new): after its turn's start
        text = self.masker.mask(inbound.text or "")  # as _recall does: no secret in history
        user = ChatMessage(role="user", content=text, turn_id=inbound.id)
        messages = self.history.peek(inbound.session_key, [user])
        if messages is None:
            return None

        def start(tx: Tx) -> None:
            not_fresh = _NotFresh(inbound.id)
            if held:
                tx.inbox.expect_first(inbound.session_key, inbound.id, NotHeldAfterAll(inbound.id))
            tx.inbox.start(inbound.id, not_fresh)
            tx.turns.add_new(inbound.id, inbound.session_key, inbound.trace_id, not_fresh)
            self._append(tx, inbound.session_key, inbound.id, user)
            self._audit_started(tx, inbound, inbound)

        self._defer(inbound, start)
        if held:
            self._presumed.add(inbound.id)
        turn = TurnRow(inbound.id, inbound.session_key, inbound.trace_id, 0, TurnStatus.RUNNING)
        return inbound, turn, Recall(messages)

    def _begin(
        self,
        tx: Tx,
        inbound_id: str,
        known: InboundMessage | None,
        prepared: PreparedMessage | None = None,
    ) -> tuple[InboundMessage, TurnRow, Recall | None] | MessageInbound | None:
        """Start or resume the turn; a new message turn comes with the history to think on.
        A new turn whose message has files is not started without them ``prepared``:
        then the message is returned, to fetch them outside any transaction."""
        turn: TurnRow | None
        if known is not None:
            found = tx.turns.of_inbound(inbound_id)  # its status and its turn: one read
            if found is None or found[0].terminal:
                return None
            inbound, turn = known, found[1]
        else:
            row = tx.inbox.get(inbound_id)
            if row is None or row.status.terminal:
                return None
            inbound = row.message
            turn = tx.turns.get(inbound.id)
        if self.fence is not None:
            self.fence(tx, inbound.session_key)
        conversation: Recall | None = None
        if turn is None:
            message = inbound if isinstance(inbound, MessageInbound) else None
            if message is not None and message.attachments and prepared is None:
                return message
            # Made running: no need to set that below.
            turn = tx.turns.create(inbound.id, inbound.session_key, inbound.trace_id)
            conversation = self._opened(tx, inbound, message, prepared)
        elif turn.status in (TurnStatus.DONE, TurnStatus.FAILED):
            return None
        tx.inbox.set_status(inbound.id, InboundStatus.RUNNING)
        if turn.status != TurnStatus.RUNNING:
            tx.turns.set(turn.id, status=TurnStatus.RUNNING)
        return inbound, turn, conversation

    def _opened(
        self,
        tx: Tx,
        inbound: InboundMessage,
        message: MessageInbound | None,
        prepared: PreparedMessage | None,
    ) -> Recall:
        """What a turn just made (running) starts with: a message's words in the history
        (with a note on each of its files, ``prepared``) and the history to think on; a
        direct call, an empty conversation (a fresh step)."""
        conversation = Recall([])
        if message is not None:
            # No configured secret goes to history, nor to the model: one a person typed
            # (a token pasted into the chat), nor one quoted by a file's note.
            text = self.masker.mask(prepared.text if prepared is not None else message.text or "")
            files: tuple[FileNote, ...] = ()
            if prepared is not None:
                files = tuple(
                    replace(note, detail=self.masker.mask(note.detail)) for note in prepared.files
                )
            self._append(
                tx,
                inbound.session_key,
                inbound.id,
                ChatMessage(role="user", content=text, files=files, turn_id=inbound.id),
            )
            for notice in prepared.notices if prepared is not None else ():
                tx.outbox.add(self._notice(inbound, notice))
            conversation = self._recall(tx, inbound.session_key)
        self._audit_started(tx, inbound, message)
        return conversation

    def _audit_started(
        self, tx: Tx, inbound: InboundMessage, message: MessageInbound | None
    ) -> None:
        tx.audit.write(
            "turn.started",
            trace_id=inbound.trace_id,
            session_key=inbound.session_key,
            inbound_id=inbound.id,
            kind=inbound.kind,
            address=str(inbound.address),
            sender=inbound.sender.id,
            text=message.text if message is not None else None,
        )

    def _append(self, tx: Tx, session_key: str, turn_id: str, message: ChatMessage) -> None:
        """``message`` into the session's history, and into its cache once committed."""
        if message.turn_id != turn_id:  # the cache holds it as a load would read it
            message = replace(message, turn_id=turn_id)
        added = self.history.added
        tx.turns.append_message(
            session_key, turn_id, message, lambda seq: added(tx, session_key, seq, message)
        )

    def _suspend(self, tx: Tx, inbound: InboundMessage, turn: TurnRow) -> None:
        tx.inbox.set_status(inbound.id, InboundStatus.WAITING_APPROVAL)
        tx.turns.set(turn.id, status=TurnStatus.WAITING)

    def _persist_step(
        self,
        tx: Tx,
        inbound: InboundMessage,
        turn: TurnRow,
        reply: BrainReply,
        tools: Sequence[Tool],
        made: Counter[str] | None = None,
    ) -> list[CallRow] | None:
        """Record the brain's decision and store its step with its calls settled (all
        committed before any of them runs); None if the model is looping. ``made``: the
        turn's calls so far, when this process made the turn (then not read back)."""
        if len(reply.tool_calls) > MAX_CALLS_PER_STEP:
            log.warning(
                "turn %s: the model asked for %d calls in one step; the first %d run",
                turn.id, len(reply.tool_calls), MAX_CALLS_PER_STEP,
            )  # fmt: skip
            reply = replace(reply, tool_calls=reply.tool_calls[:MAX_CALLS_PER_STEP])
        self._audit_decision(tx, inbound, turn.step, reply)
        hashes = [args_hash(c.name, c.args) for c in reply.tool_calls]
        # Call ids come from the model, and some servers reuse them ("call_0" in every
        # response, or twice in one); the store needs each id once, so a reused one is
        # replaced (in the history too, so the model still sees matching ids).
        ids = [c.id for c in reply.tool_calls]
        if made is None:
            taken, repeated = tx.turns.taken_and_repeats(turn.id, ids, hashes)
        else:  # only a model's ids may be stored already (ids made here are new)
            taken = tx.turns.taken([i for i in ids if not is_new_id(i)])
            repeated = max((made[h] for h in hashes), default=0)
        if repeated >= MAX_IDENTICAL_CALLS:
            return None
        calls: list[ToolCall] = []
        for call in reply.tool_calls:
            if call.id in taken:
                call = replace(call, id=f"call_{new_id()}")
            taken.add(call.id)
            calls.append(call)
        self._append(
            tx,
            inbound.session_key,
            turn.id,
            ChatMessage(
                role="assistant", content=reply.text, tool_calls=tuple(calls), turn_id=turn.id
            ),
        )
        rows = tx.turns.add_calls(turn.id, turn.step, list(zip(calls, hashes, strict=True)))
        if made is not None:
            tx.on_commit(lambda: made.update(hashes))
        return self.executor.settle_step(tx, inbound, turn, tools, rows)

    def _plan_direct(
        self, tx: Tx, inbound: ToolCallInbound, turn: TurnRow, tools: Sequence[Tool]
    ) -> list[CallRow]:
        request = inbound.tool_call
        call = ToolCall(id=f"{inbound.id}-0", name=request.tool, args=request.args)
        rows = tx.turns.add_calls(turn.id, turn.step, [(call, args_hash(call.name, call.args))])
        return self.executor.settle_step(tx, inbound, turn, tools, rows)

    def _close_step(
        self, tx: Tx, inbound: InboundMessage, turn: TurnRow, progress: StepProgress
    ) -> tuple[TurnRow, Recall | None]:
        """Store the step's results, append them to history and move to the next step,
        atomically; a message turn gets the history for its next brain step in the same
        go."""
        self._step_closed(tx, inbound, turn, progress)
        conversation = None
        if isinstance(inbound, MessageInbound):
            conversation = self._recall(tx, inbound.session_key)
        following = TurnRow(turn.id, turn.session_key, turn.trace_id, turn.step + 1, turn.status)
        return following, conversation

    def _close_here(
        self, inbound: InboundMessage, turn: TurnRow, progress: StepProgress
    ) -> tuple[TurnRow, Recall] | None:
        """``_close_step`` without a commit of its own (``writes_later``, the history
        held by the cache): written with the next checkpoint. None when it cannot be."""
        if not self.writes_later or not isinstance(inbound, MessageInbound):
            return None
        results = [self._tool_message(call, turn.id) for call in progress.calls]
        messages = self.history.peek(inbound.session_key, results)
        if messages is None:
            return None
        self._defer(inbound, partial(self._step_closed, inbound=inbound, turn=turn,
                                     progress=progress))  # fmt: skip
        following = TurnRow(turn.id, turn.session_key, turn.trace_id, turn.step + 1, turn.status)
        return following, Recall(messages)

    def _step_closed(
        self, tx: Tx, inbound: InboundMessage, turn: TurnRow, progress: StepProgress
    ) -> None:
        """The writes that close a step: its results, in the history too, and the next step."""
        self.executor.record(tx, inbound, progress.unrecorded)
        if isinstance(inbound, MessageInbound):
            for call in progress.calls:
                self._append(tx, inbound.session_key, turn.id, self._tool_message(call, turn.id))
        tx.turns.set(turn.id, step=turn.step + 1)

    def _tool_message(self, call: CallRow, turn_id: str) -> ChatMessage:
        result = ToolResult.from_json(call.result or {"ok": False, "output": "no result"})
        return ChatMessage(
            role="tool",
            content=self.result_text(result, call.id),
            tool_call_id=call.id,
            name=call.name,
            turn_id=turn_id,
        )

    def result_text(self, result: ToolResult, call_id: str) -> str:
        text = self.registry.for_model(result, call_id)
        if result.ok:
            return text
        return f"⚠️ {result.error_code or 'ERROR'}: {text}"

    # -- the brain ------------------------------------------------------------------------
    async def _ask_brain(
        self,
        inbound: MessageInbound,
        turn: TurnRow,
        tools: Sequence[Tool],
        conversation: Recall | None,
    ) -> BrainReply | None:
        """The brain's next move; its audit record is written with the commit that acts on
        it (the step, or the turn's end)."""
        if conversation is None:
            conversation = await self.store.run(
                partial(self._recall, session_key=inbound.session_key)
            )
        if self.previews is not None and self.previews.take_stop(inbound.id):
            # Stopped while its tools ran: it ends here, with what it has said.
            return BrainReply(text="(stopped)", route_reason="stopped by the user", markdown=True)
        preview = (
            self.previews.open(inbound.answer_to, inbound.id) if self.previews is not None else None
        )
        context = BrainContext(
            trace_id=inbound.trace_id,
            session_key=inbound.session_key,
            origin=inbound.address,
            sender=inbound.sender,
            step=turn.step,
            images=tuple(self.media.images_of(inbound)),
            preview=preview,
            direct=inbound.direct,
            notes=conversation.notes,
            model=conversation.model,
            summary=conversation.summary,
        )
        try:
            try:
                reply = await self._answer(inbound, conversation, tools, context)
            finally:
                if preview is not None and self.previews is not None:
                    await self.previews.close(preview)
        except StoreUnavailable:  # the store is away (the budget read): the turn waits
            raise
        except Exception as exc:  # a task boundary: the turn fails, the daemon goes on
            log.exception("brain %s failed on turn %s", self.brain.name, turn.id)
            text = f"Sorry, I could not think this through: {type(exc).__name__}."
            await self._finish(inbound, turn, text, InboundStatus.FAILED, f"brain error: {exc}")
            return None
        model = reply.details.get("model")
        if model:
            latency = float(reply.details.get("latency_ms", 0) or 0) / 1000  # type: ignore[arg-type]
            metrics.LLM_SECONDS.labels(str(model)).observe(latency)
            for kind in ("prompt", "completion"):
                tokens = int(reply.details.get(f"{kind}_tokens", 0) or 0)  # type: ignore[call-overload]
                metrics.LLM_TOKENS.labels(str(model), kind).inc(tokens)
        return reply

    async def _answer(
        self,
        inbound: MessageInbound,
        recall: Recall,
        tools: Sequence[Tool],
        context: BrainContext,
    ) -> BrainReply:
        """The command registry first: a command answers for itself (its first step) and
        reports the results of the calls it asked for (the next); anything else is the
        brain's to answer (its history summarised first when it has outgrown the budget)."""
        command = self.commands.parse(inbound.text or "")
        if command is None:
            recall, context = await self._summarised(inbound, recall, context)
            return await self.brain.step(recall.messages, tools, context)
        if context.step == 0:
            return await self.commands.run(*command, context, tools)
        results = trailing_results(recall.messages)
        return BrainReply(
            text=summarise_results(results) if results else None,
            route_reason="rules: reported tool results",
        )

    async def _summarised(
        self, inbound: MessageInbound, recall: Recall, context: BrainContext
    ) -> tuple[Recall, BrainContext]:
        """``recall`` as the prompt carries it: when its history outgrows the budget (or
        the window, ``HISTORY_LIMIT`` messages), the oldest part summarised by the model
        (with the summary before it), page by page from the summary's end, each page
        kept as a checkpoint; the prompt then carries the summary instead of those
        messages. A crash before a checkpoint makes that page again at the next try; one
        made twice is kept once (a summary only moves forward). The model away, or no
        model: the window as it was."""
        summarise = getattr(self.brain, "summarise", None)
        if summarise is None or len(recall.seqs) != len(recall.messages):
            return recall, context  # no model, or one that reads no chat (no seqs)
        cut = summary_cut(self.config, recall.messages, recall.notes, recall.summary)
        if recall.older_before is not None:  # half the window goes too: seldom again
            cut = max(cut, len(recall.messages) - HISTORY_LIMIT // 2)
        # Never this turn's own messages: the question being answered stays word for word.
        own = (i for i, m in enumerate(recall.messages) if m.turn_id == inbound.id)
        cut = min(cut, next(own, cut))
        if not cut and recall.older_before is None:
            return recall, context
        window = list(zip(recall.seqs[:cut], recall.messages[:cut], strict=True))
        summary, upto = recall.summary, recall.summary_upto
        for _page in range(MAX_SUMMARY_PAGES):  # the rest at the next turns
            page = await self.store.run(
                partial(summary_page, session_key=inbound.session_key, after=upto,
                        before=recall.older_before, window=window,
                        chars=self.config.context_chars * 3 // 4)
            )  # fmt: skip
            if not page:
                break
            made = await summarise(summary, [message for _seq, message in page], context)
            if made is None or not made.text:
                break
            summary, upto = made.text, page[-1][0]
            keep = partial(self._keep_summary, inbound, context, upto, made)
            await self._checkpoint(inbound, keep)
        if upto == recall.summary_upto:
            return recall, context
        kept = [(seq, m) for seq, m in zip(recall.seqs, recall.messages, strict=True) if seq > upto]
        summarised = replace(
            recall, messages=[m for _s, m in kept], seqs=tuple(seq for seq, _m in kept),
            summary=summary, summary_upto=upto,
            older_before=recall.older_before if upto < (recall.older_before or 0) else None,
        )  # fmt: skip
        return summarised, replace(context, summary=summary)

    def _keep_summary(
        self, inbound: MessageInbound, context: BrainContext, upto: int, made: BrainReply, tx: Tx
    ) -> None:
        # Inside the brain's step: never with writes deferred to it (only a model
        # summarises, and a model's turns defer nothing: ``writes_later``).
        tx.summaries.keep(inbound.session_key, upto, str(made.text))
        self._audit_decision(tx, inbound, context.step, made)  # its tokens count

    def _audit_decision(
        self, tx: Tx, inbound: InboundMessage, step: int, reply: BrainReply
    ) -> None:
        tx.audit.write(
            "brain.decision",
            trace_id=inbound.trace_id,
            session_key=inbound.session_key,
            brain=self.brain.name,
            step=step,
            route_reason=reply.route_reason,
            text=reply.text,
            tool_calls=[c.to_json() for c in reply.tool_calls],
            details=reply.details,
        )

    # -- finishing ------------------------------------------------------------------------
    async def _finish(
        self,
        inbound: InboundMessage,
        turn: TurnRow,
        text: str,
        status: InboundStatus,
        error: str | None,
        attachments: Sequence[OutboundMessage] = (),
        *,
        decision: BrainReply | None = None,
        unrecorded: list[tuple[CallRow, ToolResult]] | None = None,
    ) -> None:
        text = self.masker.mask(text)  # history keeps no secret either

        def write(tx: Tx) -> None:
            if unrecorded:
                self.executor.record(tx, inbound, unrecorded)
            if decision is not None:
                self._audit_decision(tx, inbound, turn.step, decision)
            if isinstance(inbound, MessageInbound):
                self._append(
                    tx,
                    inbound.session_key,
                    turn.id,
                    ChatMessage(role="assistant", content=text, turn_id=turn.id),
                )
            markdown = decision is not None and decision.markdown
            if decision is None or decision.shown or not attachments:
                tx.outbox.add(self._reply(inbound, text, markdown=markdown))
            for extra in attachments:
                tx.outbox.add(extra)
            tx.inbox.set_status(inbound.id, status, error, result=text)
            failed = status == InboundStatus.FAILED
            tx.turns.set(turn.id, status=TurnStatus.FAILED if failed else TurnStatus.DONE)
            tx.audit.write(
                "turn.finished",
                trace_id=inbound.trace_id,
                session_key=inbound.session_key,
                status=status,
                reply=text,
                error=error,
            )

        await self._checkpoint(inbound, write)
        metrics.TURN_SECONDS.observe(max(0.0, time.time() - inbound.received_at.timestamp()))

    async def _finish_direct(
        self,
        inbound: InboundMessage,
        calls: list[CallRow],
        unrecorded: list[tuple[CallRow, ToolResult]],
    ) -> None:
        if not calls:
            raise ValueError(f"tool_call turn {inbound.id} has no call to report")
        call = calls[0]
        result = ToolResult.from_json(call.result or {"ok": False, "output": "no result"})
        status = {
            ErrorCode.APPROVAL_DENIED: InboundStatus.DENIED,
            ErrorCode.APPROVAL_EXPIRED: InboundStatus.EXPIRED,
        }.get(result.error_code or ErrorCode.TOOL_ERROR, InboundStatus.FAILED)
        if result.ok:
            status = InboundStatus.DONE
        text = f"{call.name}: " + self.result_text(result, call.id)
        turn = TurnRow(inbound.id, inbound.session_key, inbound.trace_id, 0, TurnStatus.RUNNING)
        error = None if result.ok else json.dumps({"error_code": result.error_code})
        await self._finish(inbound, turn, text, status, error, unrecorded=unrecorded)

    def _notice(self, inbound: InboundMessage, text: str) -> OutboundMessage:
        """Said to the sender before the answer (what a voice note was heard as)."""
        return OutboundMessage(
            to=inbound.answer_to,
            text=self.masker.mask(text),
            kind=OutboundKind.NOTICE,
            quote=inbound.quoted_by_answer,
            trace_id=inbound.trace_id,
        )

    def _reply(
        self, inbound: InboundMessage, text: str, *, markdown: bool = False
    ) -> OutboundMessage:
        return OutboundMessage(
            to=inbound.answer_to,
            text=self.masker.mask(text),
            format=TextFormat.MARKDOWN if markdown else TextFormat.PLAIN,
            quote=inbound.quoted_by_answer,
            trace_id=inbound.trace_id,
            metadata={"inbound_id": inbound.id},
        )
