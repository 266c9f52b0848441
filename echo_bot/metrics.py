"""Prometheus metrics (``GET /metrics`` on the HTTP server), in a registry of our own."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry()

INBOUND = Counter(
    "echo_bot_inbound_total", "Inbound messages taken from the inbox", ["channel", "kind"],
    registry=REGISTRY,
)  # fmt: skip
OUTBOUND = Counter(
    "echo_bot_outbound_total", "Outbound delivery attempts by outcome", ["channel", "status"],
    registry=REGISTRY,
)  # fmt: skip
TURN_SECONDS = Histogram(
    "echo_bot_turn_seconds", "Time from receipt to the final reply of a turn",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 3600), registry=REGISTRY,
)  # fmt: skip
LLM_SECONDS = Histogram(
    "echo_bot_llm_seconds", "Latency of LLM calls", ["model"],
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60), registry=REGISTRY,
)  # fmt: skip
LLM_TOKENS = Counter(
    "echo_bot_llm_tokens_total", "LLM tokens", ["model", "kind"], registry=REGISTRY
)
TOOL_CALLS = Counter(
    "echo_bot_tool_calls_total", "Tool executions by result", ["tool", "result"],
    registry=REGISTRY,
)  # fmt: skip
APPROVALS = Counter(
    "echo_bot_approvals_total", "Approval requests and their outcomes", ["outcome"],
    registry=REGISTRY,
)  # fmt: skip
QUEUE = Gauge("echo_bot_queue_depth", "Work waiting in the store", ["queue"], registry=REGISTRY)
REMINDER_LAG = Histogram(
    "echo_bot_reminder_lag_seconds", "How late reminders fired",
    buckets=(1, 5, 30, 60, 300, 3600, 86400), registry=REGISTRY,
)  # fmt: skip


def render(queues: dict[str, int]) -> bytes:
    for name, value in queues.items():
        QUEUE.labels(name).set(value)
    return generate_latest(REGISTRY)


__all__ = ["CONTENT_TYPE", "render"]
