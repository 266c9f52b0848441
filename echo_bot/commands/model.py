"""/model: which model this chat thinks with, and switching it to another the config
offers (``[openai] models``); kept per chat in the store, so a restart keeps it."""

from __future__ import annotations

from ..config import OpenAIConfig
from ..conversation import BrainReply
from ..plugins import command_prefix
from ..store import Store, Tx
from .registry import Command, CommandContext, CommandRegistry


def register_model_command(
    commands: CommandRegistry, store: Store, openai: OpenAIConfig | None
) -> None:
    """``openai``: the model's section when this daemon thinks with one (None: the
    offline rules brain only)."""

    async def model(rest: str, ctx: CommandContext) -> BrainReply:
        if openai is None:
            return BrainReply(text="No model here: this daemon answers with its offline rules.")
        prefix = command_prefix(ctx.brain.origin.channel)
        key = ctx.brain.session_key
        offered = [openai.model, *(m for m in openai.models if m != openai.model)]
        wanted = rest.strip()
        if not wanted:
            chosen = await store.run(lambda tx: tx.reminders.chat_model(key))
            current = chosen if chosen in openai.models else openai.model
            others = [m for m in offered if m != current]
            text = f"This chat thinks with {current}" + (
                " (the default)." if current == openai.model else "."
            )
            if others:
                text += f" Also offered: {', '.join(others)}. Switch with {prefix}model NAME."
            return BrainReply(text=text)
        if wanted.lower() == "default":
            wanted = openai.model
        if wanted not in offered:
            return BrainReply(
                text=f"{wanted[:100]!r} is not offered here: choose one of {', '.join(offered)}"
                " ([openai] model and models)."
            )
        kept = None if wanted == openai.model else wanted

        def switch(tx: Tx) -> None:
            tx.reminders.set_chat_model(key, kept)
            tx.audit.write("chat.model", trace_id=ctx.brain.trace_id, session_key=key,
                           model=wanted, by=ctx.brain.sender.id)  # fmt: skip

        await store.run(switch)
        return BrainReply(text=f"This chat now thinks with {wanted}, also after a restart.")

    commands.register(
        Command("model", "show or switch this chat's model", model, usage="[NAME|default]")
    )
