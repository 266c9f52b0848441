"""Brains decide the next step of a turn: a reply, or tool calls."""

from .base import Brain, BrainContext, BrainReply

__all__ = ["Brain", "BrainContext", "BrainReply"]
