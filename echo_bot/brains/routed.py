"""LLM first, rules when the LLM cannot answer — and say so.

Slash commands never reach a brain (the turn runner answers them). After
``fallback_after`` failures in a row the brain stays on rules and tries the LLM again
every ``probe_interval``. A daily token budget, when set, switches to rules until
midnight and tells the approvers once.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import datetime
from zoneinfo import ZoneInfo

from ..conversation import ChatMessage
from ..tools.base import Tool
from .base import Brain, BrainContext, BrainReply, LLMUnavailable

log = logging.getLogger(__name__)

UsageToday = Callable[[float], Awaitable[int]]  # tokens used since the given timestamp
Notify = Callable[[str, BrainContext], Awaitable[None]]


class RoutedBrain:
    name = "routed"

    def __init__(
        self,
        llm: Brain,
        rules: Brain,
        *,
        fallback_after: int = 2,
        probe_interval: float = 60.0,
        daily_token_budget: int | None = None,
        usage_since: UsageToday | None = None,
        notify: Notify | None = None,
        timezone: str = "UTC",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.llm = llm
        self.reads_chat = bool(getattr(llm, "reads_chat", False))
        self.rules = rules
        self.fallback_after = fallback_after
        self.probe_interval = probe_interval
        self.budget = daily_token_budget
        self.usage_since = usage_since
        self.notify = notify
        self.zone = ZoneInfo(timezone)
        self.clock = clock
        self.failures = 0
        self.next_probe = 0.0
        self._budget_day_told: str | None = None
        # The turns (trace ids) whose log has the LLM's failure: a turn of several steps
        # may ask it more than once, and the terminal chat shows warnings on its screen.
        self._failure_logged: deque[str] = deque(maxlen=256)

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        now = self.clock()
        if await self._over_budget(now, context):
            return await self._offline(
                conversation, tools, context, "the daily token budget is used up", "budget"
            )
        if self.failures >= self.fallback_after and now < self.next_probe:
            wait = int(self.next_probe - now)
            return await self._offline(
                conversation, tools, context, "the LLM is unavailable", f"next probe in {wait}s"
            )
        try:
            reply = await self.llm.step(conversation, tools, context)
        except LLMUnavailable as exc:
            if exc.server_away:  # else this request's fault: other chats keep the model
                self.failures += 1
                if self.failures >= self.fallback_after:
                    self.next_probe = now + self.probe_interval
            if context.trace_id in self._failure_logged:
                log.info("LLM unavailable again in this turn (%s)", exc)
            else:
                self._failure_logged.append(context.trace_id)
                log.warning("LLM unavailable (%s); answering with the rules brain", exc)
            return await self._offline(
                conversation, tools, context, "the LLM is unavailable", f"LLM failed: {exc}"
            )
        if self.failures:
            log.info("LLM answers again after %d failure(s)", self.failures)
        self.failures = 0
        return reply

    async def summarise(
        self, earlier: str | None, messages: Sequence[ChatMessage], context: BrainContext
    ) -> BrainReply | None:
        """The model's summary of ``messages``; None while the model is away or the day's
        budget is spent (the window stays as it is; the failure is not counted: the
        step's own call says whether the model is away)."""
        summarise = getattr(self.llm, "summarise", None)
        now = self.clock()
        if summarise is None or await self._over_budget(now, context):
            return None
        if self.failures >= self.fallback_after and now < self.next_probe:
            return None
        try:
            made: BrainReply | None = await summarise(earlier, messages, context)
        except LLMUnavailable as exc:
            log.info("no summary this time: %s", exc)
            return None
        return made

    async def _offline(
        self,
        conversation: Sequence[ChatMessage],
        tools: Sequence[Tool],
        context: BrainContext,
        why: str,
        reason: str,
    ) -> BrainReply:
        reply = await self.rules.step(conversation, tools, context)
        text = reply.text
        if text is not None:
            text = f"⚠️ {why[0].upper()}{why[1:]}; answering offline.\n\n{text}"
        return replace(reply, text=text, route_reason=f"{reply.route_reason} ({reason})")

    async def _over_budget(self, now: float, context: BrainContext) -> bool:
        if not self.budget or self.usage_since is None:
            return False
        local = datetime.fromtimestamp(now, self.zone)
        midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
        used = await self.usage_since(midnight.timestamp())
        if used < self.budget:
            return False
        day = midnight.date().isoformat()
        if self._budget_day_told != day and self.notify is not None:
            self._budget_day_told = day
            await self.notify(
                f"⚠️ The LLM's daily token budget ({self.budget}) is used up ({used} tokens "
                "today); answering with the rules brain until midnight.",
                context,
            )
        return True
