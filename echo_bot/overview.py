"""What ``echo-bot status`` and the console's Status page both show, read the same way,
and the one way a reminder is cancelled (``echo-bot reminders cancel`` and the console's
Cancel button)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .statuses import ReminderStatus
from .store import Tx
from .store.meta import InstanceRow
from .store.reminders import ReminderRow

# A daemon refreshes its instance row every 5 s; unseen for longer than this, it is gone.
INSTANCE_GONE_AFTER = 15.0


@dataclass(frozen=True, slots=True)
class Overview:
    info: dict[str, Any]  # what the last daemon to start said of itself
    counts: dict[str, int]  # meta.queue_counts()
    reminders: list[ReminderRow]  # active, soonest first
    instances: list[InstanceRow]
    held: dict[str, list[str]]  # instance name -> the leases it holds
    now: float  # the database's clock

    @property
    def live(self) -> list[InstanceRow]:
        return [i for i in self.instances if self.now - i.seen_at <= INSTANCE_GONE_AFTER]

    @property
    def gone(self) -> list[InstanceRow]:
        return [i for i in self.instances if self.now - i.seen_at > INSTANCE_GONE_AFTER]

    @property
    def mcp(self) -> dict[str, Any]:
        servers = self.info.get("mcp") or {}
        return servers if isinstance(servers, dict) else {}


def read(tx: Tx) -> Overview:
    return Overview(
        info=tx.meta.daemon_info(),
        counts=tx.meta.queue_counts(),
        reminders=tx.reminders.active(),
        instances=tx.meta.instances(),
        held=tx.leases.holders(INSTANCE_GONE_AFTER),
        now=tx.meta.now(),
    )


_CORE_LEASES = ("session:", "delivery:")  # the others are channels' (ChannelHost.hold)


def holding(leases: list[str]) -> str:
    """What a live daemon holds: the poller, channels' outboxes, sessions ('' if none)."""
    sessions = sum(1 for name in leases if name.startswith("session:"))
    delivers = [n.removeprefix("delivery:") for n in leases if n.startswith("delivery:")]
    # A channel's own lease, named "<channel>-<what>:<key>" (its poller, its sync).
    receives = sorted(
        {n.split(":")[0].split("-")[0] for n in leases if not n.startswith(_CORE_LEASES)}
    )
    parts = [
        f"receives for {', '.join(receives)}" if receives else "",
        f"delivers the outbox of {', '.join(delivers)}" if delivers else "",
        f"drives {sessions} session(s)" if sessions else "",
    ]
    return "; ".join(p for p in parts if p)


def mcp_state(server: dict[str, Any]) -> str:
    """An MCP server's state as ``status`` says it: "ready, 3 tools — …"."""
    why = f" — {server['error']}" if server.get("error") else ""
    why += f" — degraded: {server['limited']}" if server.get("limited") else ""
    tools = f", {server.get('tools', 0)} tools" if server.get("state") == "ready" else ""
    return f"{server.get('state')}{tools}{why}"


def cancel_reminder(tx: Tx, reminder_id: str) -> str:
    """Cancel an active reminder: '' when done, else why not. A running daemon skips it
    when its time comes (the change is announced on commit)."""
    row = tx.reminders.get(reminder_id)
    if row is None:
        return f"no reminder {reminder_id}"
    if not tx.reminders.set_status(reminder_id, ReminderStatus.CANCELLED):
        return f"reminder {reminder_id} is already {row.status}"
    return ""
