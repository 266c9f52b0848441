"""The agent: durable turns (runner) and who runs them when (dispatcher)."""

from .dispatcher import Dispatcher
from .runner import TurnRunner

__all__ = ["Dispatcher", "TurnRunner"]
