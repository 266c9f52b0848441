"""Approval prompts as Block Kit: the call as the gate rendered it, in a code block
(escaped for mrkdwn), and its buttons — Approve once / Allow for a time (where offered)
/ Deny.

Each button's ``action_id`` is the gate's opaque action (``verb:request id[:seconds]``).
The prompt is kept by the edge when it is sent (``Edge.keep_prompt``, by conversation
and ``ts``), and a press counts only for an action that message carries
(``Edge.decide``): any other action, or a message that is no prompt, is refused there.
The gate then checks the presser as for any decision (only approvers decide; a request
decided once stays decided, so a replayed press changes nothing).

A section holds at most 3,000 characters: a long call takes several code blocks. The
text is rendered, masked and split by the core's pipeline, as every other text.
"""

from __future__ import annotations

from typing import Any

from echo_bot.bus import Masking
from echo_bot.events import Button, DecisionVerb, OutboundMessage
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
        # verbatim: Slack links no @channel, @here or name the model wrote on its own
        {"type": "section", "text": {"type": "mrkdwn", "text": text, "verbatim": True}}
        for text in text_sections(message, masker)
    ]
    elements = [button(b, masker) for row in message.buttons for b in row]
    if elements:
        blocks.append({"type": "actions", "block_id": "approval", "elements": elements})
    return blocks
