"""The approval gate: who is asked (policy), where the prompt goes (routing), and the
lifecycle of a request (created, decided once, or expired)."""

from .gate import ApprovalGate, Ask, DecisionOutcome, Refusal
from .policy import ApprovalPolicy
from .routing import ApproverDirectory

__all__ = [
    "ApprovalGate",
    "ApprovalPolicy",
    "ApproverDirectory",
    "Ask",
    "DecisionOutcome",
    "Refusal",
]
