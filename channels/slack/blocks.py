"""Approval prompts as Block Kit: the call as the gate rendered it, in a code block
(escaped for mrkdwn), and its buttons — Approve once / Allow for a time (where offered)
/ Deny.

Each button's ``action_id`` is the gate's opaque action (``verb:request id[:seconds]``).
The actions of a prompt are kept in the store by the message's ``ts``
(``host.remember_note``) when it is sent, and a press counts only for an action that
message carries: a payload naming any other action, or a message that is no prompt, is
refused as forged. The gate then checks the presser as for any decision (only
approvers decide; a request decided once stays decided, so a replayed press changes
nothing).

A section holds at most 3,000 characters: a long call takes several code blocks. The
text is rendered, masked and split by the core's pipeline, as every other text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from echo_bot.bus import ChannelHost, Masking
from echo_bot.events import Address, Button, DecisionVerb, OutboundMessage
from echo_bot.richtext import parts as richtext
from echo_bot.richtext.model import Formatted, Span

from .formatting import SlackText

SECTION = SlackText(limit=2_900, wire_limit=3_000)  # a section's text: Slack takes 3,000
LABEL_MAX = 75  # characters of a button's label
STYLES = {DecisionVerb.APPROVE_ONCE.value: "primary", DecisionVerb.DENY.value: "danger"}


def text_sections(message: OutboundMessage, masker: Masking) -> list[str]:
    """The prompt's text as section texts, through the core's pipeline: the call in
    code blocks, the rest as it is."""
    text = message.text
    call = message.approval.call if message.approval is not None else None
    spans: tuple[Span, ...] = ()
    if call and call in text:
        start = text.index(call)
        before, after = text[:start].rstrip(), text[start + len(call) :].lstrip()
        text = f"{before}\n\n{call}\n\n{after}".strip("\n")
        start = text.index(call)
        spans = (Span("pre", start, start + len(call)),)
    return richtext.formatted_parts(Formatted(text, spans), masker, SECTION)


def button(item: Button, masker: Masking) -> dict[str, Any]:
    label = masker.mask(item.label)
    label = label if len(label) <= LABEL_MAX else label[: LABEL_MAX - 1] + "…"
    element: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": label, "emoji": True},
        "action_id": item.action,
        "value": item.action,
    }
    style = STYLES.get(item.action.split(":", 1)[0])
    if style:
        element["style"] = style
    return element


def blocks_of(message: OutboundMessage, masker: Masking) -> list[dict[str, Any]]:
    """The message as blocks: its sections, then its buttons (none on an outcome)."""
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}}
        for text in text_sections(message, masker)
    ]
    elements = [button(b, masker) for row in message.buttons for b in row]
    if elements:
        blocks.append({"type": "actions", "block_id": "approval", "elements": elements})
    return blocks


def actions_of(buttons: list[list[Button]]) -> list[str]:
    return [button.action for row in buttons for button in row]


@dataclass(frozen=True)
class Kept:
    """A prompt as sent: the chat it went to and its buttons' actions."""

    to: Address
    actions: list[str]


class Prompts:
    """A prompt's message (conversation + ts) → where it went and its actions, in the
    store."""

    def __init__(self, host: ChannelHost) -> None:
        self.host = host

    async def keep(self, to: Address, ts: str, actions: list[str]) -> None:
        kept = json.dumps({"to": str(to), "actions": actions})
        await self.host.remember_note(f"slack-prompt:{to.chat_id}:{ts}", kept)

    async def kept(self, channel: str, ts: str) -> Kept | None:
        found = await self.host.recall_note(f"slack-prompt:{channel}:{ts}")
        if found is None:
            return None
        try:
            loaded = json.loads(found[0])
            to = Address.parse(str(loaded["to"]))
            return Kept(to, [str(a) for a in loaded["actions"]])
        except (ValueError, KeyError, TypeError):
            return None
