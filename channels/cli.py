"""The terminal channel: ``echo-bot chat`` (and ``echo-bot run`` on a terminal).

Lines typed become inbound messages from the local owner; replies are printed. An
approval prompt is shown as ``Approve tool(args)? [y/N]`` and the next line answers it.
With piped input (``exit_on_eof``) each line waits for its reply before the next is
read, and the channel asks the daemon to stop after the last reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import sys
import threading
from typing import TextIO

from echo_bot.bus import Bus, ChannelSetup
from echo_bot.events import (
    Address,
    ApprovalDecision,
    DecisionVerb,
    InboundKind,
    InboundMessage,
    OutboundKind,
    OutboundMessage,
    Receipt,
    Sender,
    new_id,
    parse_approval_action,
)

ADDRESS = Address(channel="cli", chat_id="local")
YES = {"y", "yes", "approve", "ok"}


class CliChannel:
    name = "cli"

    def __init__(self, setup: ChannelSetup) -> None:
        options = setup.options
        self._stdin: TextIO = options.get("stdin", sys.stdin)
        self._stdout: TextIO = options.get("stdout", sys.stdout)
        self._interactive: bool = bool(options.get("interactive", self._stdin.isatty()))
        self._exit_on_eof: bool = bool(options.get("exit_on_eof", False))
        self._request_stop = setup.request_stop
        user = getpass.getuser()
        self._sender = Sender(id=user, name=user)
        self._bus: Bus | None = None
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        # approval id → the allowed verbs, for the prompt the next line answers
        self._prompts: list[tuple[str, set[DecisionVerb]]] = []
        self._awaiting: set[str] = set()  # inbound ids whose reply has not arrived
        self._changed = asyncio.Event()

    # -- Channel protocol -----------------------------------------------------------------
    async def start(self, bus: Bus) -> None:
        self._bus = bus
        loop = asyncio.get_running_loop()
        reader = threading.Thread(target=self._read_stdin, args=(loop,), daemon=True)
        reader.start()
        self._task = asyncio.create_task(self._run(), name="cli-channel")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def health(self) -> dict[str, object]:
        return {"status": "ok", "interactive": self._interactive}

    async def send(self, message: OutboundMessage) -> Receipt:
        inbound_id = message.metadata.get("inbound_id")
        if message.kind == OutboundKind.APPROVAL and message.edit_of is None:
            self._show_prompt(message)
        elif message.edit_of is not None and message.metadata.get("outcome"):
            self._print(
                f"{message.metadata['outcome']} (request {message.metadata.get('approval_id')})"
            )
        else:
            self._print(message.text)
        if inbound_id and message.kind == OutboundKind.REPLY:
            self._awaiting.discard(str(inbound_id))
        self._changed.set()
        return Receipt(channel_message_id=message.id)

    # -- rendering ------------------------------------------------------------------------
    def _print(self, text: str) -> None:
        self._stdout.write(text.rstrip("\n") + "\n")
        self._stdout.flush()

    def _show_prompt(self, message: OutboundMessage) -> None:
        verbs = set()
        approval_id = str(message.metadata.get("approval_id", ""))
        for row in message.buttons:
            for button in row:
                parsed = parse_approval_action(button.action)
                if parsed is not None:
                    verbs.add(parsed[0])
                    approval_id = parsed[1]
        # The gate's rendering: every argument complete, hidden characters escaped; a
        # prompt without it (arguments too long to show) offers Deny only.
        call = message.metadata.get("call")
        if DecisionVerb.APPROVE_ONCE in verbs and call:
            self._print(f"Approve {call}? [y/N] (request {approval_id})")
        else:
            self._print(message.text + "\nOnly Deny is offered here. [N]")
        self._prompts.append((approval_id, verbs))

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
        while True:
            line = await self._lines.get()
            if line is None:
                await self._end_of_input()
                return
            if self._prompts:
                await self._answer(line)
                continue
            if not line.strip():
                continue
            await self._submit(line)
            if not self._interactive:
                await self._wait_reply_or_prompt()

    async def _submit(self, text: str) -> None:
        assert self._bus is not None
        line_id = new_id()
        message = InboundMessage(
            kind=InboundKind.MESSAGE,
            address=ADDRESS,
            sender=self._sender,
            text=text,
            external_id=line_id,
            metadata={"message_id": line_id},
        )
        published = await self._bus.publish(message)
        self._awaiting.add(published.inbound_id)

    async def _answer(self, line: str) -> None:
        assert self._bus is not None
        approval_id, verbs = self._prompts.pop(0)
        approve = line.strip().lower() in YES and DecisionVerb.APPROVE_ONCE in verbs
        verb = DecisionVerb.APPROVE_ONCE if approve else DecisionVerb.DENY
        decision = ApprovalDecision(
            request_id=approval_id,
            verb=verb,
            decided_by=ADDRESS,
            sender_id=self._sender.id,
            via="cli",
        )
        await self._bus.publish(
            InboundMessage(
                kind=InboundKind.APPROVAL_DECISION,
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
        while self._awaiting and not self._prompts:
            self._changed.clear()
            await self._changed.wait()

    async def _end_of_input(self) -> None:
        for approval_id, _verbs in self._prompts:
            self._print(
                f"(no answer given; request {approval_id} stays pending — "
                f"decide with: echo-bot approvals approve|deny {approval_id})"
            )
        self._prompts.clear()
        if self._exit_on_eof:
            self._request_stop()
