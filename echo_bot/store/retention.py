"""Pruning what is finished and old. Pending work is never touched."""

from __future__ import annotations

from .sql import SqlDb


def prune(db: SqlDb, before: float) -> dict[str, int]:
    """Delete finished rows last touched before ``before``; return counts per table."""
    counts: dict[str, int] = {}

    def delete(table: str, sql: str, args: list[object]) -> None:
        counts[table] = db.execute(f"DELETE FROM {table} WHERE {sql}", args).rowcount

    delete(
        "inbox",
        "status IN ('done', 'failed', 'denied', 'expired') AND updated_at < ?",
        [before],
    )
    delete(
        "receipts",
        "delivered_at < ? AND outbound_id NOT IN (SELECT prompt_outbound_id FROM approvals"
        " WHERE status = 'pending' AND prompt_outbound_id IS NOT NULL)",
        [before],
    )
    delete("outbox", "status IN ('sent', 'failed') AND finished_at < ?", [before])
    delete("audit", "ts < ?", [before])
    delete("reminder_fires", "fired_at < ?", [before])
    delete("approvals", "status != 'pending' AND created_at < ?", [before])
    return counts
