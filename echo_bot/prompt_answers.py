"""Approval prompts on a network without buttons (Matrix): answered by reaction or by
reply, for every such channel alike.

A prompt (``OutboundKind.APPROVAL``) is sent as the gate rendered it, then how to answer
(``prompt_text``): react ✅ (approve once), ⏱ (allow here for 1 h, when offered) or ❌
(deny), or reply ``approve`` / ``deny`` to it. The channel keeps the prompt by its
message ID (``Edge.keep_prompt``, in the store: a reaction after a restart, or seen by
another daemon on a shared store, still finds its request) and hands a reaction or reply
to ``Edge.react`` / ``Edge.reply``, which read the answer here and take it only when the
prompt offers it (``Edge.decide``): the actions are opaque and were made by the gate,
never derived from text anyone can type. The gate then checks the decider is an approver
(a non-approver is refused, and told so in the chat).
"""

from __future__ import annotations

from .events import Button, DecisionVerb, OutboundMessage

APPROVE, ALLOW, DENY = "✅", "⏱", "❌"
# What a reaction means; Element may add the variation selector U+FE0F to an emoji.
REACTIONS = {
    APPROVE: DecisionVerb.APPROVE_ONCE,
    ALLOW: DecisionVerb.ALLOW_FOR,
    DENY: DecisionVerb.DENY,
}
REPLIES = {"approve": DecisionVerb.APPROVE_ONCE, "yes": DecisionVerb.APPROVE_ONCE,
           "deny": DecisionVerb.DENY, "no": DecisionVerb.DENY}  # fmt: skip


def actions_of(buttons: list[list[Button]]) -> list[str]:
    return [button.action for row in buttons for button in row]


def instructions(actions: list[str]) -> str:
    verbs = {a.split(":", 1)[0] for a in actions}
    ways = []
    if DecisionVerb.APPROVE_ONCE.value in verbs:
        ways.append(f"{APPROVE} to approve once")
    if DecisionVerb.ALLOW_FOR.value in verbs:
        ways.append(f"{ALLOW} to allow it here for 1 h")
    ways.append(f"{DENY} to deny")  # a prompt too long to show offers Deny only
    ways[0] = f"React {ways[0]}"
    typed = "`approve` / `deny`" if DecisionVerb.APPROVE_ONCE.value in verbs else "`deny`"
    return ", ".join(ways) + f" — or reply {typed} to this message."


def prompt_text(message: OutboundMessage) -> str:
    """The prompt as the gate rendered it, then how to answer it here."""
    return f"{message.text}\n\n{instructions(actions_of(message.buttons))}"


def verb_of_reaction(key: str) -> DecisionVerb | None:
    return REACTIONS.get(key.replace("\ufe0f", "").strip())


def verb_of_reply(body: str) -> DecisionVerb | None:
    """``approve`` / ``deny`` (or yes / no) as the whole first line of a reply's own (its
    quoted fallback, ``>`` lines, left out): "yes, but what does it do?" is a question,
    not a decision."""
    lines = [line for line in body.splitlines() if line.strip() and not line.startswith(">")]
    words = lines[0].lower().replace(",", " ").rstrip(".! ").split() if lines else []
    return REPLIES.get(words[0]) if len(words) == 1 else None


def is_lone_answer(text: str) -> bool:
    """Whether ``text`` is only ``approve`` or ``deny`` (a reply's way of answering,
    typed as a message of its own)."""
    words = text.strip().lower().rstrip(".!").split()
    return len(words) == 1 and verb_of_reply(words[0]) is not None
