"""A channel for in-process tests: records what the core sends, injects what users do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from echo_bot.bus import Bus, Capabilities
from echo_bot.events import (
    Address,
    ApprovalDecision,
    DecisionInbound,
    MessageInbound,
    OutboundMessage,
    Receipt,
    Sender,
    new_id,
    parse_approval_action,
)
from tests.waiting import eventually


class RecordingChannel:
    capabilities = Capabilities()  # a test's channel: none of the optional parts

    def __init__(self, name: str = "cli") -> None:
        self.name = name
        self.sent: list[OutboundMessage] = []
        self.bus: Bus | None = None
        self._changed = asyncio.Event()  # replaced (and set) at every send
        # A hook a test sets to make sends fail: returns an exception to raise, or None.
        self.failure: Callable[[OutboundMessage], Exception | None] | None = None
        self.attempts: list[OutboundMessage] = []

    async def start(self, bus: Bus) -> None:
        self.bus = bus

    async def stop(self) -> None:
        pass

    def health(self) -> dict[str, object]:
        return {"status": "ok"}

    async def send(self, message: OutboundMessage) -> Receipt:
        self.attempts.append(message)
        if self.failure is not None:
            error = self.failure(message)
            if error is not None:
                raise error
        self.sent.append(message)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return Receipt(channel_message_id=f"m{len(self.sent)}")

    # -- helpers for tests ----------------------------------------------------------------
    def address(self, chat: str = "local") -> Address:
        return Address(channel=self.name, chat_id=chat)

    async def say(
        self,
        text: str,
        *,
        chat: str = "local",
        sender: str = "owner",
        external_id: str | None = None,
    ) -> str:
        assert self.bus is not None
        published = await self.bus.publish(
            MessageInbound(
                address=self.address(chat),
                sender=Sender(id=sender, name=sender),
                text=text,
                external_id=external_id or new_id(),
            )
        )
        return published.inbound_id

    async def press(
        self, action: str, *, chat: str = "local", sender: str = "owner", via: str | None = None
    ) -> str:
        assert self.bus is not None
        parsed = parse_approval_action(action)
        assert parsed is not None, action
        verb, request_id, seconds = parsed
        decision = ApprovalDecision(
            request_id=request_id,
            verb=verb,
            decided_by=self.address(chat),
            sender_id=sender,
            via=via or self.name,
            allow_for_seconds=seconds,
        )
        published = await self.bus.publish(
            DecisionInbound(
                address=self.address(chat),
                sender=Sender(id=sender),
                decision=decision,
                external_id=new_id(),
            )
        )
        return published.inbound_id

    async def wait_for(
        self, predicate: Callable[[OutboundMessage], bool], timeout: float = 10.0
    ) -> OutboundMessage:
        """The first sent message matching ``predicate`` (waiting for it if needed)."""

        def found() -> OutboundMessage | None:
            return next((message for message in self.sent if predicate(message)), None)

        def seen() -> str:
            sent = "; ".join(f"{m.kind} {m.text[:60]!r}" for m in self.sent) or "none"
            return f"a matching message on {self.name}; sent: {sent}"

        return await eventually(found, timeout, seen, woken_by=lambda: self._changed.wait())

    async def reply_to(self, inbound_id: str, timeout: float = 10.0) -> OutboundMessage:
        return await self.wait_for(
            lambda m: m.metadata.get("inbound_id") == inbound_id and m.kind == "reply", timeout
        )

    async def prompt_for(self, inbound_id: str, timeout: float = 10.0) -> OutboundMessage:
        return await self.wait_for(
            lambda m: (
                m.metadata.get("inbound_id") == inbound_id
                and m.kind == "approval"
                and m.edit_of is None
            ),
            timeout,
        )
