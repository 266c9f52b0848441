"""The offline rules brain: tool-card triggers, a greeting or a question about what it
can do (answered from its tools and the commands), else help. Slash commands are not
its business: the turn runner asks the command registry before any brain.

Stateless over the conversation: after tool results it turns them into the reply;
otherwise it reads the newest user message.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from ..commands.registry import CommandRegistry, summarise_results, trailing_results
from ..conversation import ChatMessage, FileNote, ToolCall
from ..events import new_id
from ..plugins import command_prefix
from ..tools.base import Tool, words
from .base import BrainContext, BrainReply

NO_MATCH_HINT = "I did not understand that. Send /help to see what I can do."


def no_match_hint(prefix: str = "/") -> str:
    """``NO_MATCH_HINT`` with the help command as people type it where they are."""
    return NO_MATCH_HINT.replace("/help", f"{prefix}help")


# A message of only these words is a greeting ("hello", "hi there", "good morning!").
GREETING_STARTS = frozenset({"hello", "hi", "hey", "hiya", "howdy", "hallo", "greetings", "yo"})
GREETING_WORDS = GREETING_STARTS | {
    "good", "morning", "afternoon", "evening", "day", "there", "again", "all", "everyone", "bot",
}  # fmt: skip
_GOOD_TIMES = (["good", "morning"], ["good", "afternoon"], ["good", "evening"], ["good", "day"])
# Questions about what the bot does, matched as phrases in the message.
ABOUT_PHRASES = (
    "what can you do",
    "what do you do",
    "what are you",
    "who are you",
    "how can you help",
    "what can i ask",
    "what can i do",
    "help me",
    "help",
)


@functools.lru_cache(maxsize=4096)
def _phrase(phrase: str) -> tuple[tuple[str, ...], str]:
    """A phrase's words, and the words joined and padded for a substring test."""
    phrase_words = tuple(words(phrase))
    return phrase_words, f" {' '.join(phrase_words)} "


# A trigger phrase as matched: its words, the words joined and padded for a substring
# test, and how many there are (phrases without words are left out).
_Phrase = tuple[tuple[str, ...], str, int]


@functools.lru_cache(maxsize=1024)
def _phrases(phrases: tuple[str, ...]) -> tuple[_Phrase, ...]:
    """A tool's trigger phrases made ready once (a turn scores every tool's)."""
    made = (_phrase(phrase) for phrase in phrases)
    return tuple((ws, padded, len(ws)) for ws, padded in made if ws)


def _best_score(word_set: set[str], padded_text: str, phrases: tuple[str, ...]) -> float:
    """How well the best of ``phrases`` matches: a whole phrase (its word count + 0.5) >
    all its words, apart (0.8 a word, for a phrase of two or more) > nothing (0)."""
    best = 0.0
    for phrase_words, padded_phrase, size in _phrases(tuple(phrases)):
        if padded_phrase in padded_text:
            score = size + 0.5
        elif size > 1 and word_set.issuperset(phrase_words):
            score = size * 0.8
        else:
            continue
        if score > best:
            best = score
    return best


def match_tool(text: str, tools: Sequence[Tool]) -> tuple[Tool, float] | None:
    """The best positive trigger match among tools without a negative match."""
    text_words = words(text)
    padded_text = f" {' '.join(text_words)} "
    word_set = set(text_words)
    best: tuple[Tool, float] | None = None
    for tool in tools:
        if tool.negative_triggers and _best_score(word_set, padded_text, tool.negative_triggers):
            continue
        score = _best_score(word_set, padded_text, tool.triggers)
        if score > 0 and (best is None or score > best[1]):
            best = (tool, score)
    return best


class RulesBrain:
    name = "rules"
    local = True  # answers in this process at once: nothing to wait for between steps

    def __init__(self, commands: CommandRegistry) -> None:
        self.commands = commands

    async def step(
        self, conversation: Sequence[ChatMessage], tools: Sequence[Tool], context: BrainContext
    ) -> BrainReply:
        hint = no_match_hint(command_prefix(context.origin.channel))
        if not conversation:
            return BrainReply(text=hint, route_reason="rules: empty conversation")
        trailing = trailing_results(conversation)
        if trailing:
            return BrainReply(
                text=summarise_results(trailing), route_reason="rules: reported tool results"
            )
        last = conversation[-1]
        notes = last.files if last.role == "user" else ()
        text = (last.content or "").strip()
        if notes and not text:  # files and nothing else: say where they are
            return BrainReply(text=files_reply(notes), route_reason="rules: files received")
        match = match_tool(text, tools)
        if match is None and not notes:
            about = self._about(text, tools)
            if about is not None:
                return about
        if match is None:
            if notes:
                return BrainReply(
                    text=files_reply(notes) + "\n\n" + hint,
                    route_reason="rules: files received, no trigger matched",
                )
            return BrainReply(text=hint, route_reason="rules: no trigger matched")
        tool, score = match
        args = tool.extract_args(text)
        if args is None:
            return BrainReply(
                text=f"That sounds like a job for {tool.name}, but I could not read its "
                f"details from your message. Try: /tool {tool.name} {{json arguments}}",
                route_reason=f"rules: trigger for {tool.name}, arguments not extracted",
            )
        return BrainReply(
            tool_calls=[ToolCall(id=new_id(), name=tool.name, args=args)],
            route_reason=f"rules: trigger matched {tool.name} (score {score:.1f})",
        )

    def _about(self, text: str, tools: Sequence[Tool]) -> BrainReply | None:
        """A greeting, or a question about what the bot can do: answered with what it
        can do offline (its tools' triggers, its commands); None for anything else."""
        said = words(text)
        padded = f" {' '.join(said)} "
        starts = bool(said) and (said[0] in GREETING_STARTS or said[:2] in _GOOD_TIMES)
        greeting = starts and set(said) <= GREETING_WORDS
        asks = any(_phrase(p)[1] in padded for p in ABOUT_PHRASES)
        if not (greeting or asks):
            return None
        intro = "Hello! " if greeting else ""
        return BrainReply(
            text=intro + self.abilities(tools),
            route_reason="rules: greeting" if greeting else "rules: asked what I can do",
        )

    def abilities(self, tools: Sequence[Tool]) -> str:
        """What this brain can do: the tools it can choose from a message (an example of
        each), then the commands."""
        lines = ["Here is what I can do:"]
        worded = sorted((t for t in tools if t.triggers), key=lambda t: t.name)
        for tool in worded:
            lines.append(f"• {_gist(tool.description)} — e.g. “{tool.triggers[0]}”")
        others = len(tools) - len(worded)
        if others:
            lines.append(f"• {others} more tool(s) by name: /tools lists them, /tool runs one")
        names = ", ".join(f"/{c.name}" for c in self.commands.all())
        if names:
            lines.append(f"Commands: {names} (/help says more).")
        return "\n".join(lines)


def files_reply(notes: Sequence[FileNote]) -> str:
    """What an offline brain can say about the files it got: where each is."""
    return "\n".join(note.reply for note in notes)


def _gist(description: str) -> str:
    """A tool description's first clause ("Tell the current date, weekday and time")."""
    return re.split(r"[.:(]", description, maxsplit=1)[0].strip() or description.strip()
