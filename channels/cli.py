"""The terminal channel: ``echo-bot chat`` (and ``echo-bot run`` on a terminal).

Lines typed become inbound messages from the local owner; replies are printed. An
approval prompt is shown as ``Approve tool(args)? [y/N]``; while it is on screen the
next line answers it. Once it is settled elsewhere (``echo-bot approvals``, expiry) its
outcome is printed and lines are messages again. At start the prompts still pending
for the terminal are shown again (its screen is gone after a restart).

With piped input (``exit_on_eof``) each line waits for its reply before the next is
read, and the channel asks the daemon to stop after the last reply. Prompts from
before the start are listed, not answered by piped lines (the script never saw them).

When stdout closes (``echo-bot chat | head -1``), ``chat`` stops with status 141, as a
process killed by SIGPIPE does; what it could not print stays queued in the outbox
and the next terminal chat shows it first, marked with the time it was made.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

from echo_bot.bus import Bus, Capabilities, ChannelHost
from echo_bot.dates import clock_text
from echo_bot.errors import EXIT_OUTPUT_CLOSED, ChannelError
from echo_bot.events import (
    Address,
    ApprovalDecision,
    DecisionInbound,
    DecisionVerb,
    MessageInbound,
    OutboundKind,
    OutboundMessage,
    Receipt,
    Sender,
    TextFormat,
    id_time,
    new_id,
    parse_approval_action,
)
from echo_bot.richtext.parts import rendered_as_written

log = logging.getLogger(__name__)

# A terminal in its line mode passes at most this many bytes of one line (Linux's 4096,
# the newline included) and drops the rest: a line this long was most likely cut.
TTY_LINE_MAX = 4095
CUT_LINE = (
    "This line is as long as a terminal passes in one line (4095 bytes), so its end was"
    " most likely cut off; it was not sent. For a long call, put its JSON arguments in a"
    " file and send /tool NAME @FILE, or decide long requests in the console."
)
ADDRESS = Address(channel="cli", chat_id="local")
YES = {"y", "yes", "approve", "ok"}
ALLOW = {"a", "allow"}  # "allow here for 1 h", where the prompt offers it
OUTPUT_CLOSED = "the terminal's output is closed; kept for the next terminal chat"


class CliChannel:
    name = "cli"
    # Reachable only from this process: on a shared store its messages are delivered by
    # the daemon running it (echo_bot/delivery.py), wherever the turn ran.
    local = True
    # Approval prompts are answered by a typed line (y/N); a reply prints as it is
    # written; the prompts still pending are shown again below the banner.
    capabilities = Capabilities(previews=True, shows_when_ready=True)

    def __init__(self, section: None, options: Mapping[str, Any], host: ChannelHost) -> None:
        self._host = host
        self.edge = host.edge(self.name)  # the owner at the machine: no allowlist
        self._stdin: TextIO = options.get("stdin", sys.stdin)
        self._stdout: TextIO = options.get("stdout", sys.stdout)
        self._interactive: bool = bool(options.get("interactive", self._stdin.isatty()))
        self._exit_on_eof: bool = bool(options.get("exit_on_eof", False))
        self._zone: str | None = None  # the terminal chat's, read at start
        # Outbound made before this start waited for a terminal: it is marked so.
        self._since = host.started_at
        user = getpass.getuser()
        self._sender = Sender(id=user, name=user)
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        # The prompts on screen, oldest first: (approval id, the verbs it offers). The
        # next line answers the first; a prompt settled elsewhere leaves the list.
        self._prompts: list[tuple[str, set[DecisionVerb]]] = []
        self._allow_for: dict[str, int | None] = {}  # request → its "allow here" seconds
        # Pending requests shown at start for information only (piped input).
        self._listed: set[str] = set()
        self._deferred: list[OutboundMessage] = []  # pending at start, shown by ready()
        self._awaiting: set[str] = set()  # inbound ids whose reply has not arrived
        self._changed = asyncio.Event()
        self._input_ended = False
        self._output_closed = False
        # A reply being written: its key (the turn's inbound id) and what of it is
        # printed; its final message then prints only the rest.
        self._streaming: tuple[str, str] | None = None
        self._streamed: dict[str, str] = {}  # finished streams whose reply is still to come

    # -- Channel protocol -----------------------------------------------------------------
    async def start(self, bus: Bus) -> None:
        self._zone = await self._host.timezone_for(ADDRESS)
        # Read now, shown by ready() below the banner; until then their first
        # deliveries, if still queued, are held back.
        self._deferred = await self._host.pending_prompts(ADDRESS)
        loop = asyncio.get_running_loop()
        reader = threading.Thread(target=self._read_stdin, args=(loop,), daemon=True)
        reader.start()
        self._task = asyncio.create_task(self._run(), name="cli-channel")

    async def ready(self) -> None:
        """The daemon is up (its banner is out): show the prompts still pending here."""
        with contextlib.suppress(ChannelError):
            self._show_pending()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def health(self) -> dict[str, object]:
        status = "degraded" if self._output_closed else "ok"
        return {"status": status, "interactive": self._interactive}

    async def send(self, message: OutboundMessage) -> Receipt:
        if self._output_closed:
            self._host.detach(self.name)  # closed before delivery took this channel on
            raise ChannelError(OUTPUT_CLOSED)
        markdown = message.format == TextFormat.MARKDOWN
        self._show(message, await rendered_as_written(message.text, markdown, self._host.masker))
        inbound_id = message.metadata.get("inbound_id")
        if inbound_id and message.kind == OutboundKind.REPLY:
            self._awaiting.discard(str(inbound_id))
        self._changed.set()
        return Receipt(channel_message_id=message.id)

    # -- a reply as it is written -----------------------------------------------------------
    async def show_preview(self, to: Address, key: str, text: str) -> None:
        """The reply as written so far, word by word: a word is printed once it is whole
        (a secret is one word), and nothing more once the Markdown would read as a
        secret (the final reply then shows the text masked, whole)."""
        text = text[: max(text.rfind(" "), text.rfind("\n")) + 1]
        if self._output_closed or not text.strip():
            return
        if await rendered_as_written(text, True, self._host.masker) != text:
            return
        text = text.lstrip()  # as the final reply will be
        printed = ""
        if self._streaming is not None and self._streaming[0] == key:
            printed = self._streaming[1]
        if not text.startswith(printed):
            return  # rewritten (another step): the final reply shows it whole
        self._write(text[len(printed) :])
        self._streaming = (key, text)

    async def end_preview(self, to: Address, key: str) -> None:
        if self._streaming is not None and self._streaming[0] == key:
            self._streamed = {key: self._streaming[1]}  # the newest only
            self._streaming = None
            self._write("\n")

    def _write(self, text: str) -> None:
        try:
            self._stdout.write(text)
            self._stdout.flush()
        except (OSError, ValueError) as exc:
            self._output_gone(exc)

    # -- rendering ------------------------------------------------------------------------
    def _show(self, message: OutboundMessage, shown: str) -> None:
        """``shown``: the text as it is printed (``rendered_as_written``)."""
        held = self._held(message)
        view = message.approval
        if message.kind == OutboundKind.APPROVAL and message.edit_of is None:
            self._show_approval(message, held)
        elif message.edit_of is not None and view is not None and view.outcome:
            self._show_outcome(view.request_id, view.outcome, held)
        elif message.file is not None:
            caption = f": {message.text}" if message.text.strip() else ""
            self._print(f"{held}📎 {message.file.name} ({message.file.size} bytes){caption}")
        else:
            self._show_text(message, held, shown)

    def _show_approval(self, message: OutboundMessage, held: str) -> None:
        """An approval prompt's first delivery (or again: /approvals)."""
        approval_id = _approval_id(message)
        if held and self._known(approval_id):
            return  # its first delivery, still queued: shown again at start already
        if held or approval_id in self._listed:
            # Made before this start and not pending then (settled since: its
            # outcome follows), or listed for information (piped input).
            self._print(f"{held}{self._describe(message)} (request {approval_id})")
        elif not any(_approval_id(p) == approval_id for p in self._deferred):
            self._show_prompt(message)  # new, or again (/approvals)

    def _show_outcome(self, approval_id: str, outcome: str, held: str) -> None:
        """A prompt settled (here or elsewhere): it no longer takes the next line."""
        self._prompts = [p for p in self._prompts if p[0] != approval_id]
        self._listed.discard(approval_id)
        self._deferred = [p for p in self._deferred if _approval_id(p) != approval_id]
        self._print(f"{held}{outcome} (request {approval_id})")

    def _show_text(self, message: OutboundMessage, held: str, shown: str) -> None:
        """A text; a reply that was streamed prints only what the stream did not."""
        printed = self._streamed.pop(str(message.metadata.get("inbound_id", "")), None)
        if shown != message.text:
            self._print(held + shown)  # what the Markdown reads as, masked: never streamed
            return
        if not printed or message.kind != OutboundKind.REPLY:
            self._print(held + message.text)
            return
        printed = printed.rstrip()  # the final reply has no trailing space
        rest = message.text[len(printed) :] if message.text.startswith(printed) else None
        if rest is None:
            self._print(message.text)  # not what was streamed: shown whole
        elif rest.strip():
            self._print(rest.lstrip(" ").lstrip("\n"))  # the stream ended at a space

    def _held(self, message: OutboundMessage) -> str:
        """A mark for a message made before this start: it waited for a terminal."""
        made = id_time(message.id)
        if made is None or made >= self._since:
            return ""
        dated = clock_text(made, self._zone, date=True)
        today = dated[:10] == clock_text(time.time(), self._zone, date=True)[:10]
        when = clock_text(made, self._zone) if today else dated
        return f"(from {when}, not shown until now) "

    def _known(self, approval_id: str) -> bool:
        """Whether this request's prompt is shown (or about to be) already."""
        return (
            approval_id in self._listed
            or any(shown == approval_id for shown, _verbs in self._prompts)
            or any(_approval_id(p) == approval_id for p in self._deferred)
        )

    def _print(self, text: str) -> None:
        try:
            self._stdout.write(text.rstrip("\n") + "\n")
            self._stdout.flush()
        except (OSError, ValueError) as exc:  # EPIPE, EIO after a hang-up, a closed file
            self._output_gone(exc)
            raise ChannelError(OUTPUT_CLOSED) from exc

    @staticmethod
    def _describe(message: OutboundMessage) -> str:
        call = message.approval.call if message.approval is not None else None
        if call:
            return f"Approval asked: {call}"
        return message.text.splitlines()[0] if message.text else "Approval asked"

    def _show_prompt(self, message: OutboundMessage) -> None:
        verbs = set()
        approval_id = _approval_id(message)
        for row in message.buttons:
            for button in row:
                parsed = parse_approval_action(button.action)
                if parsed is not None:
                    verbs.add(parsed[0])
                    approval_id = parsed[1]
                    if parsed[0] is DecisionVerb.ALLOW_FOR:
                        self._allow_for[approval_id] = parsed[2]
        if self._input_ended:
            self._print(
                f"{self._describe(message)} (request {approval_id}); this terminal takes no "
                f"more input — decide with: echo-bot approvals approve|deny {approval_id}"
            )
            return
        # The gate's rendering: every argument complete, hidden characters escaped; a
        # prompt without it (arguments too long to show) offers Deny only.
        call = message.approval.call if message.approval is not None else None
        if DecisionVerb.APPROVE_ONCE in verbs and call:
            allow = " — or a: allow it here for 1 h" if DecisionVerb.ALLOW_FOR in verbs else ""
            self._print(f"Approve {call}? [y/N] (request {approval_id}){allow}")
        else:
            self._print(message.text + "\nOnly Deny is offered here. [N]")
        if not any(shown == approval_id for shown, _verbs in self._prompts):
            self._prompts.append((approval_id, verbs))

    def _show_pending(self) -> None:
        """The prompts still pending for this terminal, again: a terminal's screen does
        not outlive the process. With piped input they are listed, not answerable."""
        prompts, self._deferred = self._deferred, []
        if not prompts:
            return
        many = len(prompts) > 1
        count = f"{len(prompts)} approvals" if many else "1 approval"
        if self._interactive:
            self._print(
                f"{count} asked before this start {'are' if many else 'is'} still waiting "
                f"for your answer (y approves, anything else denies):"
            )
            for prompt in prompts:
                self._show_prompt(prompt)
            return
        self._print(
            f"{count} asked before this start {'are' if many else 'is'} still pending "
            f"(piped lines do not answer {'them' if many else 'it'}); decide with: "
            f"echo-bot approvals approve|deny ID"
        )
        for prompt in prompts:
            approval_id = _approval_id(prompt)
            self._listed.add(approval_id)
            self._print(f"• {self._describe(prompt)} (request {approval_id})")

    def _output_gone(self, exc: BaseException) -> None:
        """stdout is closed (`chat | head -1`): stop showing and reading. What was not
        shown stays queued (send raises a retryable ChannelError) for the next start."""
        if self._output_closed:
            return
        self._output_closed = True
        self._host.detach(self.name)  # what is left stays queued, never failed
        self._changed.set()
        self._silence_stdout()
        if self._exit_on_eof:
            log.warning(
                "the terminal's output is closed (%s); stopping — what could not be shown "
                "stays queued and the next `echo-bot chat` shows it first",
                type(exc).__name__,
            )
            self._host.request_stop(EXIT_OUTPUT_CLOSED)
        else:
            log.warning(
                "the terminal's output is closed (%s); the terminal chat stops, the daemon "
                "keeps running — messages for the terminal wait in the outbox",
                type(exc).__name__,
            )

    def _silence_stdout(self) -> None:
        """Point stdout's descriptor at /dev/null: Python flushes stdout at exit, and on
        a closed pipe that fails ("Exception ignored … BrokenPipeError", status 120)."""
        with contextlib.suppress(OSError, ValueError):
            fd = self._stdout.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, fd)
            finally:
                os.close(devnull)

    # -- input ----------------------------------------------------------------------------
    def _read_stdin(self, loop: asyncio.AbstractEventLoop) -> None:
        """A plain thread: works for terminals, pipes and files alike."""
        try:
            for line in self._stdin:
                loop.call_soon_threadsafe(self._lines.put_nowait, line.rstrip("\r\n"))
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(RuntimeError):  # the loop may be closed already
                loop.call_soon_threadsafe(self._lines.put_nowait, None)

    async def _run(self) -> None:
        with contextlib.suppress(ChannelError):  # the output closed: nothing more to do
            await self._read_lines()

    async def _read_lines(self) -> None:
        while not self._output_closed:
            line = await self._lines.get()
            if self._output_closed:
                return
            if line is None:
                await self._end_of_input()
                return
            if self._prompts:
                await self._answer(line)
                continue
            if not line.strip():
                continue
            if self._interactive and len(line.encode("utf-8", "surrogateescape")) >= TTY_LINE_MAX:
                self._print(CUT_LINE)  # not sent: the end of it is missing
                continue
            await self._submit(line)
            if not self._interactive:
                await self._wait_reply_or_prompt()

    async def _submit(self, text: str) -> None:
        line_id = new_id()
        message = MessageInbound(
            address=ADDRESS,
            sender=self._sender,
            text=text,
            external_id=line_id,
            message_id=line_id,
        )
        inbound_id = await self.edge.take(message)
        if inbound_id is not None:
            self._awaiting.add(inbound_id)

    async def _answer(self, line: str) -> None:
        approval_id, verbs = self._prompts.pop(0)
        answer = line.strip().lower()
        seconds = self._allow_for.pop(approval_id, None)
        if answer in ALLOW and DecisionVerb.ALLOW_FOR in verbs:
            verb = DecisionVerb.ALLOW_FOR
        elif answer in YES and DecisionVerb.APPROVE_ONCE in verbs:
            verb = DecisionVerb.APPROVE_ONCE
        else:
            verb = DecisionVerb.DENY
        decision = ApprovalDecision(
            request_id=approval_id,
            verb=verb,
            decided_by=ADDRESS,
            sender_id=self._sender.id,
            via="cli",
            allow_for_seconds=seconds if verb is DecisionVerb.ALLOW_FOR else None,
        )
        await self.edge.take(
            DecisionInbound(
                address=ADDRESS,
                sender=self._sender,
                decision=decision,
                external_id=new_id(),
            )
        )
        if not self._interactive:
            await self._wait_reply_or_prompt()

    async def _wait_reply_or_prompt(self) -> None:
        """Piped input: the next line is read once the reply (or a prompt) is out."""
        while self._awaiting and not self._prompts and not self._output_closed:
            self._changed.clear()
            await self._changed.wait()

    async def _end_of_input(self) -> None:
        self._input_ended = True
        for approval_id, _verbs in self._prompts:
            self._print(
                f"(no answer given; request {approval_id} stays pending — "
                f"decide with: echo-bot approvals approve|deny {approval_id})"
            )
        self._prompts.clear()
        if self._exit_on_eof:
            self._host.request_stop()
            return
        # `run` on a terminal: Ctrl-D closes the chat, never the daemon.
        self._print(
            "End of input: the terminal chat is closed; the daemon keeps running — "
            f"stop it with Ctrl+C or `kill {os.getpid()}`."
        )


def _approval_id(message: OutboundMessage) -> str:
    return message.approval.request_id if message.approval is not None else ""
